//go:build !unix

package federate

import (
	"os"
	"os/exec"
)

func ownGroup(*exec.Cmd) {}

func signalGroup(p *os.Process, sig os.Signal) error { return p.Signal(sig) }

func groupAlive(*os.Process) bool { return false }

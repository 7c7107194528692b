package redisproc

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

func TestStartStop(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Missing(t, ErrNoBinary.Error())
	}
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	if s.Version == "" {
		t.Error("no version")
	}
	if _, err := s.ping(); err != nil {
		t.Fatal(err)
	}
	if cpu, err := s.CPU(); err != nil || cpu < 0 {
		t.Errorf("CPU() = %v, %v", cpu, err)
	}
	dir := s.dir
	s.Stop()
	s.Stop() // harmless
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory %s left behind: %v", dir, err)
	}
	if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Stop", s.Addr)
	}
}

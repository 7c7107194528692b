//go:build !linux

package testenv

import "syscall"

// sysProcAttr has no parent-death signal outside Linux: servers are still
// killed by test cleanup, but a crashed test binary may leave them running.
func sysProcAttr() *syscall.SysProcAttr { return nil }

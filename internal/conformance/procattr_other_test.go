//go:build !linux

package conformance

import "syscall"

// sysProcAttr: only Linux has a parent-death signal.
func sysProcAttr() *syscall.SysProcAttr { return nil }

//go:build !linux

package redisproc

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }

// Package redisproc starts a throwaway redis-server for the benchmark
// programs, which run outside go test and so cannot use the repository's
// internal/testenv (it needs a testing.TB). The server listens on a free
// loopback port, keeps no data on disk, and dies with the program (SIGKILL
// on the parent's death on Linux, Stop otherwise).
package redisproc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// StartTimeout bounds the wait for a started server to answer PING.
const StartTimeout = 10 * time.Second

// ErrNoBinary means redis-server is not on PATH.
var ErrNoBinary = errors.New("redisproc: redis-server not found on PATH (apt-get install redis-server)")

// Server is a running redis-server. Stop it when done.
type Server struct {
	// Addr is 127.0.0.1:port.
	Addr string
	// Version is the server's redis_version.
	Version string

	cmd  *exec.Cmd
	dir  string
	done chan struct{}
}

// Start starts redis-server on a free port of 127.0.0.1 and waits until it
// answers PING. A port taken between its choice and the bind is retried
// with another.
func Start() (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoBinary
	}
	var last error
	for range 5 {
		s, err := start(bin)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

func start(bin string) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("redisproc: pick a port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "redisproc-")
	if err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--logfile", "redis.log", "--daemonize", "no")
	cmd.Dir = dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redisproc: start %s: %w", bin, err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	deadline := time.Now().Add(StartTimeout)
	for {
		select {
		case <-s.done:
			log, _ := os.ReadFile(dir + "/redis.log")
			os.RemoveAll(dir)
			return nil, fmt.Errorf("redisproc: redis-server exited before becoming ready:\n%s", log)
		default:
		}
		if v, err := s.ping(); err == nil {
			s.Version = v
			return s, nil
		} else if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("redisproc: redis-server on %s not ready after %v: %w", s.Addr, StartTimeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping checks the server answers and returns its version. It checks the
// answering process is ours, so a server that took the port meanwhile is
// never mistaken for it.
func (s *Server) ping() (string, error) {
	info, err := s.info("server")
	if err != nil {
		return "", err
	}
	if pid, _ := strconv.Atoi(info["process_id"]); pid != s.cmd.Process.Pid {
		return "", fmt.Errorf("port %s is answered by pid %d, not ours (%d)", s.Addr, pid, s.cmd.Process.Pid)
	}
	return info["redis_version"], nil
}

// CPU returns the CPU time (user and system) the server has used so far,
// from INFO cpu.
func (s *Server) CPU() (time.Duration, error) {
	info, err := s.info("cpu")
	if err != nil {
		return 0, err
	}
	var total float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info[k], 64)
		if err != nil {
			return 0, fmt.Errorf("redisproc: INFO cpu %s: %w", k, err)
		}
		total += v
	}
	return time.Duration(total * float64(time.Second)), nil
}

// info runs INFO section on a new connection and returns its fields.
func (s *Server) info(section string) (map[string]string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO " + section + "\r\n")); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(head, "$") {
		return nil, fmt.Errorf("INFO answered %q", strings.TrimSpace(head))
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil {
		return nil, err
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	fields := make(map[string]string)
	for line := range strings.SplitSeq(string(buf), "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = v
		}
	}
	return fields, nil
}

// Stop kills the server, waits for it to exit and removes its directory.
// Stopping twice is harmless.
func (s *Server) Stop() {
	_ = s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-time.After(StartTimeout):
	}
	os.RemoveAll(s.dir)
}

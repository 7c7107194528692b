package testenv

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// startAttempts is how many times a start is tried with fresh ports when
// another process takes the port first (go test runs packages in parallel).
const startAttempts = 5

// RedisOptions configures StartRedis. The zero value (or a nil pointer) is a
// plain server without authentication.
type RedisOptions struct {
	// Password is the default user's password (requirepass); empty means
	// no password.
	Password string
	// User and UserPassword add an ACL user with every right
	// (on >UserPassword ~* &* +@all). Both or neither must be set.
	User, UserPassword string
	// TLS makes the server listen with TLS only (tls-port; the plain port is
	// 0), with a certificate for 127.0.0.1 and localhost signed by a CA
	// generated for this server. Clients need TLSConfig to trust it.
	TLS bool
	// Args are extra redis-server arguments ("--maxmemory-policy",
	// "noeviction", ...). They come after the generated configuration and
	// override it.
	Args []string
}

// Redis is a running redis-server started by StartRedis, or one node of a
// Cluster. Its methods are safe for concurrent use.
type Redis struct {
	// Addr is host:port, the host being 127.0.0.1.
	Addr string
	// URL is redis://[user:password@]host:port/0, or rediss:// with TLS;
	// credentials are those of User when set, else Password. A client built
	// from a rediss URL must still trust the test CA (see TLSConfig).
	URL string
	// Dir is the server's temporary directory: configuration, log
	// (redis.log, stdout.log), TLS files, cluster node file.
	Dir string

	opts    RedisOptions
	bin     string
	port    int
	busPort int // cluster bus port; 0 when not a cluster node
	pki     *testPKI
	tb      testing.TB

	mu   sync.Mutex
	proc *process // nil while killed
}

// StartRedis starts a redis-server on a free port of 127.0.0.1 with opts (nil
// means a plain server) and waits until it answers PING. The server is killed
// and its directory removed when the test ends. StartRedis skips or fails
// the test as RequireBinary does when redis-server is missing, and fails it
// when the server does not start within StartTimeout.
func StartRedis(tb testing.TB, opts *RedisOptions) *Redis {
	tb.Helper()
	r, err := newRedis(tb, RequireBinary(tb, "redis-server"), opts)
	if err != nil {
		tb.Fatal(err)
	}
	var last error
	for range startAttempts {
		ports, err := freePorts(1)
		if err != nil {
			tb.Fatal(err)
		}
		if last = r.configure(ports[0], 0); last != nil {
			tb.Fatal(last)
		}
		if last = r.start(); last == nil {
			return r
		}
		if !errors.Is(last, errPortInUse) {
			tb.Fatal(last)
		}
	}
	tb.Fatalf("testenv: redis-server did not start after %d attempts: %v", startAttempts, last)
	return nil
}

// newRedis validates opts and prepares a server in a new temporary
// directory; configure then picks its ports. The server is killed when tb
// ends (registered after the directory, so it runs before the removal).
func newRedis(tb testing.TB, bin string, opts *RedisOptions) (*Redis, error) {
	var o RedisOptions
	if opts != nil {
		o = *opts
		o.Args = slices.Clone(o.Args)
	}
	if (o.User == "") != (o.UserPassword == "") {
		return nil, errors.New("testenv: RedisOptions.User and UserPassword must be set together")
	}
	r := &Redis{opts: o, bin: bin, tb: tb, Dir: tb.TempDir()}
	if o.TLS {
		pki, err := newTestPKI(r.Dir)
		if err != nil {
			return nil, err
		}
		r.pki = pki
	}
	tb.Cleanup(r.stop)
	return r, nil
}

// configure sets the ports (busPort > 0 makes a cluster node), the address
// and URL, and writes redis.conf.
func (r *Redis) configure(port, busPort int) error {
	r.port, r.busPort = port, busPort
	r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	u := url.URL{Scheme: "redis", Host: r.Addr, Path: "/0"}
	if r.opts.TLS {
		u.Scheme = "rediss"
	}
	if user, pass := r.credentials(); pass != "" {
		u.User = url.UserPassword(user, pass)
	}
	r.URL = u.String()

	q := confQuote
	lines := []string{
		"bind 127.0.0.1",
		"daemonize no",
		`save ""`,
		"appendonly no",
		"dir " + q(r.Dir),
		"logfile " + q(filepath.Join(r.Dir, logName)),
		// Replicas sync at once instead of waiting 5s for more replicas.
		"repl-diskless-sync-delay 0",
	}
	if r.opts.TLS {
		lines = append(lines,
			"port 0",
			"tls-port "+strconv.Itoa(port),
			"tls-cert-file "+q(r.pki.certFile),
			"tls-key-file "+q(r.pki.keyFile),
			"tls-ca-cert-file "+q(r.pki.caFile),
			"tls-auth-clients no",
		)
	} else {
		lines = append(lines, "port "+strconv.Itoa(port))
	}
	if r.opts.Password != "" {
		lines = append(lines, "requirepass "+q(r.opts.Password))
	}
	if r.opts.User != "" {
		lines = append(lines, "user "+q(r.opts.User)+" on "+q(">"+r.opts.UserPassword)+` "~*" "&*" "+@all"`)
	}
	if busPort > 0 {
		lines = append(lines,
			"cluster-enabled yes",
			"cluster-config-file "+q(filepath.Join(r.Dir, "nodes.conf")),
			"cluster-node-timeout 2000",
			// An explicit bus port instead of port+10000, which may be
			// taken or beyond 65535.
			"cluster-port "+strconv.Itoa(busPort),
		)
	}
	conf := strings.Join(lines, "\n") + "\n"
	if err := os.WriteFile(r.confPath(), []byte(conf), 0o600); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
}

func (r *Redis) confPath() string { return filepath.Join(r.Dir, "redis.conf") }

// credentials returns the user and password clients should use: the ACL user
// when set, else the default user's password ("" user).
func (r *Redis) credentials() (user, pass string) {
	if r.opts.User != "" {
		return r.opts.User, r.opts.UserPassword
	}
	return "", r.opts.Password
}

func (r *Redis) authArgs() []string {
	switch user, pass := r.credentials(); {
	case user != "":
		return []string{user, pass}
	case pass != "":
		return []string{pass}
	}
	return nil
}

// start starts the configured server process and waits until it is ready.
// An error wrapping errPortInUse means the port was taken.
func (r *Redis) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.startLocked()
}

func (r *Redis) startLocked() error {
	if r.proc != nil {
		return fmt.Errorf("testenv: redis-server on %s is already running", r.Addr)
	}
	p, err := r.launch()
	if err != nil {
		return err
	}
	if err := r.waitLaunched(p); err != nil {
		return err
	}
	r.proc = p
	return nil
}

// launch starts the process without waiting; waitLaunched waits for it.
// Split so that a cluster starts its six nodes in parallel.
func (r *Redis) launch() (*process, error) {
	return startProcess(r.bin, r.Dir, append([]string{r.confPath()}, r.opts.Args...))
}

func (r *Redis) waitLaunched(p *process) error {
	if err := p.waitReady(r.Addr, r.TLSConfig(), r.authArgs()); err != nil {
		if kerr := p.kill(); kerr != nil {
			err = errors.Join(err, kerr)
		}
		return err
	}
	return nil
}

// Kill sends SIGKILL to the server, as a crash would, and waits until it has
// exited. Data is lost (nothing is persisted). Kill on a killed server does
// nothing.
func (r *Redis) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.killLocked(); err != nil {
		r.tb.Error(err)
	}
}

func (r *Redis) killLocked() error {
	if r.proc == nil {
		return nil
	}
	err := r.proc.kill()
	r.proc = nil
	return err
}

// stop is the cleanup: kill, and report a server that crashed on its own.
func (r *Redis) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil && r.proc.exited() {
		r.tb.Logf("testenv: redis-server on %s had exited by itself (%v)%s", r.Addr, r.proc.err, r.proc.logTail())
	}
	if err := r.killLocked(); err != nil {
		r.tb.Error(err)
	}
}

// Restart starts the server again on the same port with the same options
// (killing it first if it is still running) and waits until it answers PING.
// The data set starts empty. It fails the test if the server is not ready
// within StartTimeout, retrying meanwhile if the port is briefly taken.
func (r *Redis) Restart(tb testing.TB) {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.killLocked(); err != nil {
		tb.Fatal(err)
	}
	deadline := time.Now().Add(StartTimeout)
	for {
		err := r.startLocked()
		if err == nil {
			return
		}
		if !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
			tb.Fatalf("testenv: restart redis-server on %s: %v", r.Addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Running reports whether the server process is running (started and not
// killed, and not exited by itself).
func (r *Redis) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil && !r.proc.exited()
}

// TLSConfig returns a new client TLS configuration that trusts the server's
// test CA, or nil when the server does not use TLS. The server name is left
// empty: the dialer takes it from the address, and the certificate is valid
// for 127.0.0.1 and localhost.
func (r *Redis) TLSConfig() *tls.Config {
	if r.pki == nil {
		return nil
	}
	return &tls.Config{RootCAs: r.pki.pool, MinVersion: tls.VersionTLS12}
}

// ClientOption returns rueidis options for this server: its address,
// credentials (as for URL) and TLS configuration, client-side caching off,
// and ForceSingleClient (no cluster probing). Tests that need other options
// start from this.
func (r *Redis) ClientOption() rueidis.ClientOption {
	user, pass := r.credentials()
	return rueidis.ClientOption{
		InitAddress:       []string{r.Addr},
		Username:          user,
		Password:          pass,
		TLSConfig:         r.TLSConfig(),
		DisableCache:      true,
		ForceSingleClient: true,
	}
}

// Client returns a connected rueidis client for this server (ClientOption),
// closed when the test ends. It fails the test if it cannot connect.
func (r *Redis) Client(tb testing.TB) rueidis.Client {
	tb.Helper()
	return newClient(tb, r.ClientOption())
}

func newClient(tb testing.TB, opt rueidis.ClientOption) rueidis.Client {
	tb.Helper()
	c, err := rueidis.NewClient(opt)
	if err != nil {
		if c != nil {
			c.Close()
		}
		tb.Fatalf("testenv: rueidis client for %v: %v", opt.InitAddress, err)
	}
	tb.Cleanup(c.Close)
	return c
}

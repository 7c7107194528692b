package testenv

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// recordTB captures Fatalf and Skipf instead of ending the real test; both
// stop the calling goroutine, as the real ones do.
type recordTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordTB) Helper() {}

func (r *recordTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recordTB) Fatal(args ...any) {
	r.fatal = fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *recordTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recordTB) Skip(args ...any) {
	r.skip = fmt.Sprint(args...)
	runtime.Goexit()
}

func runRecorded(t *testing.T, f func(tb testing.TB)) *recordTB {
	rec := &recordTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(rec)
	}()
	<-done
	return rec
}

func TestRequireBinary(t *testing.T) {
	const missing = "mcpgate-testenv-no-such-binary"

	t.Setenv("CI", "true")
	rec := runRecorded(t, func(tb testing.TB) { RequireBinary(tb, missing) })
	if rec.fatal == "" || rec.skip != "" {
		t.Errorf("CI=true, missing binary: fatal=%q skip=%q, want a failure", rec.fatal, rec.skip)
	}

	t.Setenv("CI", "")
	rec = runRecorded(t, func(tb testing.TB) { RequireBinary(tb, missing) })
	if rec.skip == "" || rec.fatal != "" {
		t.Errorf("CI unset, missing binary: fatal=%q skip=%q, want a skip", rec.fatal, rec.skip)
	}
	if !strings.Contains(rec.skip, "CI never skips") {
		t.Errorf("skip message %q does not say that CI never skips", rec.skip)
	}

	var path string
	rec = runRecorded(t, func(tb testing.TB) { path = RequireBinary(tb, "sh") })
	if rec.fatal != "" || rec.skip != "" || !filepath.IsAbs(path) {
		t.Errorf("existing binary: path=%q fatal=%q skip=%q", path, rec.fatal, rec.skip)
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ping(ctx context.Context, c rueidis.Client) error {
	return c.Do(ctx, c.B().Ping().Build()).Error()
}

func TestStartRedisPlain(t *testing.T) {
	t.Parallel()
	r := StartRedis(t, nil)
	c := r.Client(t)
	ctx := ctxT(t, 5*time.Second)
	if err := ping(ctx, c); err != nil {
		t.Fatalf("PING: %v", err)
	}
	if err := c.Do(ctx, c.B().Set().Key("k").Value("v").Build()).Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Do(ctx, c.B().Get().Key("k").Build()).ToString(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want v", got, err)
	}
	if want := "redis://" + r.Addr + "/0"; r.URL != want {
		t.Errorf("URL = %q, want %q", r.URL, want)
	}
	if !strings.HasPrefix(r.Addr, "127.0.0.1:") {
		t.Errorf("Addr = %q, want 127.0.0.1:port", r.Addr)
	}
	if r.TLSConfig() != nil {
		t.Error("TLSConfig() is not nil without TLS")
	}
	// Nothing may be persisted: a restart after a crash starts empty.
	cfg, err := c.Do(ctx, c.B().ConfigGet().Parameter("save").Build()).AsStrMap()
	if err != nil || cfg["save"] != "" {
		t.Errorf("CONFIG GET save = %q, %v; want empty", cfg["save"], err)
	}
	if _, err := os.Stat(filepath.Join(r.Dir, logName)); err != nil {
		t.Errorf("no server log: %v", err)
	}
}

func TestStartRedisArgs(t *testing.T) {
	t.Parallel()
	r := StartRedis(t, &RedisOptions{Args: []string{"--maxmemory-policy", "allkeys-lfu"}})
	c := r.Client(t)
	cfg, err := c.Do(ctxT(t, 5*time.Second), c.B().ConfigGet().Parameter("maxmemory-policy").Build()).AsStrMap()
	if err != nil || cfg["maxmemory-policy"] != "allkeys-lfu" {
		t.Fatalf("maxmemory-policy = %q, %v; want allkeys-lfu", cfg["maxmemory-policy"], err)
	}
}

func TestKillRestart(t *testing.T) {
	t.Parallel()
	r := StartRedis(t, nil)
	c := r.Client(t)
	if err := c.Do(ctxT(t, 5*time.Second), c.B().Set().Key("k").Value("v").Build()).Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	addr := r.Addr

	r.Kill()
	if r.Running() {
		t.Fatal("Running() after Kill")
	}
	if err := c.Do(ctxT(t, 2*time.Second), c.B().Set().Key("k").Value("w").Build()).Error(); err == nil {
		t.Fatal("SET succeeded on a killed server")
	}
	if err := ping(ctxT(t, time.Second), c); err == nil {
		t.Fatal("PING succeeded on a killed server")
	}
	r.Kill() // a second Kill is a no-op

	r.Restart(t)
	if r.Addr != addr || !r.Running() {
		t.Fatalf("after Restart: Addr %q (was %q), running %v", r.Addr, addr, r.Running())
	}
	if err := ping(ctxT(t, 5*time.Second), r.Client(t)); err != nil {
		t.Fatalf("PING with a new client after Restart: %v", err)
	}
	// The client from before the crash reconnects by itself.
	ctx := ctxT(t, 5*time.Second)
	var err error
	for ctx.Err() == nil {
		if err = ping(ctx, c); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("old client never reconnected: %v", err)
	}
	if err := c.Do(ctx, c.B().Get().Key("k").Build()).Error(); !rueidis.IsRedisNil(err) {
		t.Fatalf("GET after crash+restart: %v, want nil (nothing persisted)", err)
	}

	r.Restart(t) // Restart on a running server kills it first
	if err := ping(ctxT(t, 5*time.Second), r.Client(t)); err != nil {
		t.Fatalf("PING after Restart of a running server: %v", err)
	}
}

// newClientErr connects with opt and returns the connection error; a client
// that connects is closed.
func newClientErr(opt rueidis.ClientOption) error {
	opt.Dialer.Timeout = 2 * time.Second
	c, err := rueidis.NewClient(opt)
	if c != nil {
		c.Close()
	}
	return err
}

func TestPassword(t *testing.T) {
	t.Parallel()
	// Quotes, backslash and space check the redis.conf quoting.
	const pw = `pa ss"\w0rd`
	r := StartRedis(t, &RedisOptions{Password: pw})
	if err := ping(ctxT(t, 5*time.Second), r.Client(t)); err != nil {
		t.Fatalf("PING with the password: %v", err)
	}
	opt, err := rueidis.ParseURL(r.URL)
	if err != nil || opt.Password != pw || opt.Username != "" {
		t.Fatalf("URL %q parses to user %q password %q (%v)", r.URL, opt.Username, opt.Password, err)
	}
	opt.DisableCache = true
	opt.ForceSingleClient = true
	if err := newClientErr(opt); err != nil {
		t.Fatalf("client from URL: %v", err)
	}

	bad := r.ClientOption()
	bad.Password = "wrong"
	if err := newClientErr(bad); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("wrong password: %v, want WRONGPASS", err)
	}
	bad.Password = ""
	if err := newClientErr(bad); err == nil {
		t.Error("no password: connected")
	}
}

func TestACLUser(t *testing.T) {
	t.Parallel()
	r := StartRedis(t, &RedisOptions{Password: "defaultpw", User: "gw", UserPassword: "gw-secret"})
	c := r.Client(t)
	ctx := ctxT(t, 5*time.Second)
	who, err := c.Do(ctx, c.B().AclWhoami().Build()).ToString()
	if err != nil || who != "gw" {
		t.Fatalf("ACL WHOAMI = %q, %v; want gw", who, err)
	}
	// Full rights: keys, scripts and channels.
	if err := c.Do(ctx, c.B().Eval().Script("return redis.call('SET', KEYS[1], 'x')").Numkeys(1).Key("k").Build()).Error(); err != nil {
		t.Errorf("EVAL SET as gw: %v", err)
	}
	if err := c.Do(ctx, c.B().Publish().Channel("ch").Message("m").Build()).Error(); err != nil {
		t.Errorf("PUBLISH as gw: %v", err)
	}
	if want := "redis://gw:gw-secret@" + r.Addr + "/0"; r.URL != want {
		t.Errorf("URL = %q, want %q", r.URL, want)
	}

	def := r.ClientOption()
	def.Username, def.Password = "", "defaultpw"
	if err := newClientErr(def); err != nil {
		t.Errorf("default user with requirepass: %v", err)
	}
	bad := r.ClientOption()
	bad.Password = "wrong"
	if err := newClientErr(bad); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("gw with a wrong password: %v, want WRONGPASS", err)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	r := StartRedis(t, &RedisOptions{TLS: true, Password: "tlspw"})
	if !strings.HasPrefix(r.URL, "rediss://") {
		t.Errorf("URL = %q, want rediss://", r.URL)
	}
	c := r.Client(t)
	ctx := ctxT(t, 5*time.Second)
	if err := ping(ctx, c); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}
	// Proof that TLS is what is listening: the server itself says so.
	cfg, err := c.Do(ctx, c.B().ConfigGet().Parameter("tls-port").Build()).AsStrMap()
	if err != nil || cfg["tls-port"] != strings.TrimPrefix(r.Addr, "127.0.0.1:") {
		t.Errorf("CONFIG GET tls-port = %v, %v; want the server's port", cfg, err)
	}

	plain := r.ClientOption()
	plain.TLSConfig = nil
	if err := newClientErr(plain); err == nil {
		t.Error("plain TCP client connected to the TLS-only server")
	}
	untrusted := r.ClientOption()
	untrusted.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12} // system roots only
	if err := newClientErr(untrusted); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("client not trusting the test CA: %v, want a certificate error", err)
	}
	byName := r.ClientOption()
	byName.InitAddress = []string{"localhost:" + strings.TrimPrefix(r.Addr, "127.0.0.1:")}
	if err := newClientErr(byName); err != nil && !strings.Contains(err.Error(), "connection refused") {
		// localhost may resolve to ::1 first, where nothing listens;
		// a certificate error would be the failure that matters.
		t.Errorf("client by name localhost: %v", err)
	}

	r.Kill()
	r.Restart(t)
	if err := ping(ctxT(t, 5*time.Second), r.Client(t)); err != nil {
		t.Fatalf("PING over TLS after Restart: %v", err)
	}
}

func TestStartRedisBadArgsReportsLog(t *testing.T) {
	t.Parallel()
	RequireBinary(t, "redis-server")
	rec := runRecorded(t, func(tb testing.TB) {
		StartRedis(tb, &RedisOptions{Args: []string{"--no-such-directive", "1"}})
	})
	if rec.fatal == "" {
		t.Fatal("StartRedis with a bad directive did not fail")
	}
	if !strings.Contains(rec.fatal, "no-such-directive") || !strings.Contains(rec.fatal, "tail of") {
		t.Errorf("failure does not carry the log tail naming the bad directive:\n%s", rec.fatal)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	began := time.Now()
	cl := StartCluster(t)
	t.Logf("StartCluster took %v", time.Since(began))
	if len(cl.Addrs) != 6 || len(cl.Nodes) != 6 {
		t.Fatalf("%d addrs, %d nodes; want 6", len(cl.Addrs), len(cl.Nodes))
	}

	c := cl.Client(t)
	ctx := ctxT(t, 20*time.Second)
	info, err := c.Do(ctx, c.B().ClusterInfo().Build()).ToString()
	// RESP3 sends CLUSTER INFO as a verbatim string: "txt:" then the text.
	info = strings.TrimPrefix(info, "txt:")
	if err != nil || infoField(info, "cluster_state") != "ok" || infoField(info, "cluster_slots_ok") != "16384" {
		t.Fatalf("CLUSTER INFO: %v\n%s", err, info)
	}

	const n = 1000
	cmds := make(rueidis.Commands, 0, n)
	for i := range n {
		cmds = append(cmds, c.B().Set().Key(fmt.Sprintf("key:%d", i)).Value(fmt.Sprint(i)).Build())
	}
	for i, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			t.Fatalf("SET key:%d: %v", i, err)
		}
	}
	for i := range n {
		got, err := c.Do(ctx, c.B().Get().Key(fmt.Sprintf("key:%d", i)).Build()).ToString()
		if err != nil || got != fmt.Sprint(i) {
			t.Fatalf("GET key:%d = %q, %v", i, got, err)
		}
	}

	// The keys really are spread over the three masters.
	var masters int
	var total int64
	for _, addr := range cl.Addrs {
		conn, err := dialRESP(addr, nil, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		repl, err := conn.doString("INFO", "replication")
		if err != nil {
			t.Fatal(err)
		}
		if infoField(repl, "role") != "master" {
			conn.Close()
			continue
		}
		size, err := conn.do("DBSIZE")
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		masters++
		if size.(int64) == 0 {
			t.Errorf("master %s holds no key", addr)
		}
		total += size.(int64)
	}
	if masters != 3 || total != n {
		t.Errorf("%d masters holding %d keys; want 3 masters, %d keys", masters, total, n)
	}
}

// TestClusterDirectJoin checks the other way of joining the nodes: the
// commands redis-cli sends, sent directly (StartCluster uses redis-cli).
func TestClusterDirectJoin(t *testing.T) {
	t.Parallel()
	cl := startClusterWith(t, false)
	c := cl.Client(t)
	ctx := ctxT(t, 10*time.Second)
	for i := range 100 {
		key := fmt.Sprintf("cli:%d", i)
		if err := c.Do(ctx, c.B().Set().Key(key).Value("v").Build()).Error(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
	}
}

func TestPortTaken(t *testing.T) {
	t.Parallel()
	bin := RequireBinary(t, "redis-server")
	r1 := StartRedis(t, nil)

	// A second server on r1's port must fail with errPortInUse (what
	// StartRedis retries on), and r1 answering PING on that port must not
	// be taken for the second server being ready.
	r2, err := newRedis(t, bin, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.configure(r1.port, 0); err != nil {
		t.Fatal(err)
	}
	if err := r2.start(); !errors.Is(err, errPortInUse) {
		t.Fatalf("start on a taken port: %v, want errPortInUse", err)
	}

	// Restart waits for a port that is briefly taken.
	r1.Kill()
	ln, err := net.Listen("tcp", r1.Addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		ln.Close()
	}()
	r1.Restart(t)
	if err := ping(ctxT(t, 5*time.Second), r1.Client(t)); err != nil {
		t.Fatalf("PING after Restart on a port taken for a while: %v", err)
	}
}

// TestServersDieWithTestBinary kills a test binary that started a server,
// as a crash or a `go test -timeout` would, and checks that the server dies
// with it (Pdeathsig) instead of leaking.
func TestServersDieWithTestBinary(t *testing.T) {
	if os.Getenv("TESTENV_ORPHAN_HELPER") == "1" {
		r := StartRedis(t, nil)
		fmt.Printf("pid=%d\n", r.proc.pid())
		select {} // wait to be killed
	}
	if runtime.GOOS != "linux" {
		Missing(t, "testenv: the parent-death signal is Linux only") // fails in CI, as every missing piece
	}
	t.Parallel()
	RequireBinary(t, "redis-server")
	cmd := exec.Command(os.Args[0], "-test.run=^TestServersDieWithTestBinary$", "-test.v")
	cmd.Env = append(os.Environ(), "TESTENV_ORPHAN_HELPER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	pidc := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "pid="); ok {
				pid, _ := strconv.Atoi(v)
				pidc <- pid
			}
		}
		close(pidc)
	}()
	var pid int
	select {
	case pid = <-pidc:
	case <-time.After(StartTimeout):
		t.Fatal("helper test binary did not report a server pid")
	}
	if pid == 0 || !alive(pid) {
		t.Fatalf("server pid %d not running before the kill", pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
			}
			t.Fatalf("redis-server pid %d outlived its killed test binary", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid runs and is not a zombie waiting to be reaped.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestClusterNodeCrash kills a master: its replica takes over, writes work
// again, and the restarted node rejoins the cluster.
func TestClusterNodeCrash(t *testing.T) {
	t.Parallel()
	cl := StartCluster(t)
	c := cl.Client(t)
	ctx := ctxT(t, 30*time.Second)

	// The master owning crash-key's slot is the one to kill.
	owner := -1
	for i, addr := range cl.Addrs {
		conn, err := dialRESP(addr, nil, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		repl, rerr := conn.doString("INFO", "replication")
		slot, serr := conn.do("CLUSTER", "KEYSLOT", "crash-key")
		nodes, nerr := conn.doString("CLUSTER", "NODES")
		conn.Close()
		if err := errors.Join(rerr, serr, nerr); err != nil {
			t.Fatal(err)
		}
		if infoField(repl, "role") == "master" && ownsSlot(nodes, slot.(int64)) {
			owner = i
		}
	}
	if owner < 0 {
		t.Fatal("no master owns crash-key's slot")
	}
	if err := c.Do(ctx, c.B().Set().Key("crash-key").Value("1").Build()).Error(); err != nil {
		t.Fatalf("SET before the crash: %v", err)
	}

	began := time.Now()
	cl.Nodes[owner].Kill()
	var err error
	for ctx.Err() == nil {
		if err = c.Do(ctx, c.B().Set().Key("crash-key").Value("2").Build()).Error(); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("writes never recovered after the master crashed: %v", err)
	}
	t.Logf("writes recovered %v after the master crash", time.Since(began).Round(time.Millisecond))

	cl.Nodes[owner].Restart(t)
	if err := cl.waitReady(StartTimeout); err != nil {
		t.Fatalf("restarted node did not rejoin: %v", err)
	}
}

// ownsSlot reports whether the "myself" line of CLUSTER NODES lists slot.
func ownsSlot(nodes string, slot int64) bool {
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "myself") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			l, err1 := strconv.ParseInt(lo, 10, 64)
			h, err2 := strconv.ParseInt(hi, 10, 64)
			if err1 == nil && err2 == nil && l <= slot && slot <= h {
				return true
			}
		}
	}
	return false
}

package engine

import (
	"bufio"
	"context"
	"flag"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/bench/internal/toolhive/ratelimit"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

var calls = flag.Int("calls", 100, "TestServerInstructions: calls counted per variant")

// TestServerInstructions counts the instructions redis-server executes per
// decision (valgrind's callgrind), ours against ToolHive's script run
// through the same client (rueidis), one call after the other on keys
// spread over 300 callers. A count of instructions, not a time: it repeats
// on a loaded machine, so small changes to the library can be told apart.
// Short in the test suite (it proves the tool works); for figures:
//
//	go test ./engine -run TestServerInstructions -v -calls 3000
func TestServerInstructions(t *testing.T) {
	for _, tool := range []string{"valgrind", "callgrind_control", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, tool+" is not installed (Debian packages valgrind, redis-server)")
		}
	}
	ctx := context.Background()
	cg := startCallgrindRedis(t)
	r, err := NewRedis(cg.addr, rueidis.ClientOption{DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	th := rueidis.NewLuaScript(ratelimit.ConsumeAllSource())
	tr, ttr, gr := peerRule("tenant"), peerRule("tool"), peerRule("global")
	caller := func(i int) string { return strconv.Itoa(i % 300) }
	var ops atomic.Int64 // op ids: each op placed once
	variants := []struct {
		name string
		call func(i int) error
	}{
		{"ping", func(int) error { return r.Rueidis.Do(ctx, r.Rueidis.B().Ping().Build()).Error() }},
		{PeerStore, func(i int) error {
			_, err := r.Store.Take(ctx, []limit.Check{{Rule: tr, Key: Key("cg-" + caller(i))}}, 1)
			return err
		}},
		{PeerToolHiveScript, func(i int) error {
			keys, args := ratelimit.BucketArgs("cg", "srv", []string{"user:c" + caller(i)}, peerLimit, time.Second)
			return th.Exec(ctx, r.Rueidis, keys, args).Error()
		}},
		{PeerStore3, func(i int) error {
			_, err := r.Store.Evaluate(ctx, LayeredRequest("cg", "cgl-"+caller(i), "search", tr, ttr, gr))
			return err
		}},
		// what a gateway's tools/call sends: the layered rules with the
		// tenant's usage meter, as an idempotent op (its marker written)
		{"mcpgate/layered+meter", func(i int) error {
			req := LayeredRequest("cg", "cgm-"+caller(i), "search", tr, ttr, gr)
			req.Meter = &limit.Meter{
				Key: keyspace.Usage("cgm-"+caller(i), "2026-12"), Tenant: "cgm-" + caller(i), Period: "2026-12",
				Seeded: true, ExpireAt: time.Now().Add(time.Hour), Op: "op-" + strconv.FormatInt(ops.Add(1), 10),
			}
			_, err := r.Store.Evaluate(ctx, req)
			return err
		}},
		{PeerToolHive3Raw, func(i int) error {
			c := caller(i)
			keys, args := ratelimit.BucketArgs("cg", "srv", []string{"shared", "user:c" + c, "user-tool:search:c" + c}, peerLimit, time.Second)
			return th.Exec(ctx, r.Rueidis, keys, args).Error()
		}},
	}
	per := map[string]float64{}
	for _, v := range variants {
		for i := range 300 { // every key written once, the script and function loaded
			if err := v.call(i); err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
		}
		cg.control(t, "-z")
		for i := range *calls {
			if err := v.call(i); err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
		}
		n := cg.dump(t, v.name)
		per[v.name] = float64(n) / float64(*calls)
		t.Logf("%-28s %10.0f instructions per call", v.name, per[v.name])
	}
	for _, c := range [][2]string{{PeerToolHiveScript, PeerStore}, {PeerToolHive3Raw, PeerStore3}} {
		if per[c[1]] <= per["ping"] {
			t.Fatalf("%s: %.0f instructions per call, no more than a PING: nothing was counted", c[1], per[c[1]])
		}
		t.Logf("redis-server instructions per decision, %s / %s: %.3f (>= 1: ours costs the server no more)", c[0], c[1], per[c[0]]/per[c[1]])
	}
}

// callgrindRedis is a redis-server run under valgrind's callgrind.
type callgrindRedis struct {
	addr, dir string
	pid       int
	dumps     int
}

func startCallgrindRedis(t *testing.T) *callgrindRedis {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := t.TempDir()
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+filepath.Join(dir, "cg.out"),
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	cmd.Dir = dir
	log, err := os.Create(filepath.Join(dir, "valgrind.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
	})
	cg := &callgrindRedis{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, pid: cmd.Process.Pid}
	// valgrind starts redis-server some 50 times slower than it runs natively
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", cg.addr, time.Second)
		if err == nil {
			c.Close()
			return cg
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("redis-server under valgrind did not listen on %s: %v\n%s", cg.addr, err, out)
		}
	}
}

// control runs callgrind_control with args on the server.
func (cg *callgrindRedis) control(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("callgrind_control", append(args, strconv.Itoa(cg.pid))...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("callgrind_control %v: %v\n%s", args, err, out)
	}
}

// dump writes the counts since the last zeroing to a file of their own and
// returns the instructions counted.
func (cg *callgrindRedis) dump(t *testing.T, name string) int64 {
	t.Helper()
	cg.control(t, "-d", name)
	cg.dumps++
	path := filepath.Join(cg.dir, "cg.out."+strconv.Itoa(cg.dumps))
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("callgrind dump %s: %v", name, err)
	}
	defer f.Close()
	trigger := "desc: Trigger: dump " + name
	var seen bool
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == trigger {
			seen = true
		}
		if v, ok := strings.CutPrefix(line, "totals: "); ok {
			if !seen {
				t.Fatalf("%s is not the dump of %s", path, name)
			}
			n, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", path, line, err)
			}
			return n
		}
	}
	t.Fatalf("%s: no totals line (%v)", path, sc.Err())
	panic("unreachable")
}

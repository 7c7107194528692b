package redisstore

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// connect builds a client from opt and checks that a Store works on it.
func connect(t *testing.T, opt rueidis.ClientOption) (rueidis.Client, error) {
	t.Helper()
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, err
	}
	t.Cleanup(c.Close)
	s := newStore(t, c, testTimeout)
	d, err := s.Take(ctxT(t), tenantChecks("conn", rule("fw", limit.FixedWindow, 10, time.Minute)), 1)
	if err != nil || !d.Allowed {
		t.Fatalf("Take through %v: %+v, %v", opt.InitAddress, d, err)
	}
	return c, nil
}

func TestClientOptionURL(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	opt, err := ClientOption(r.URL)
	if err != nil {
		t.Fatal(err)
	}
	if !opt.DisableCache || len(opt.InitAddress) != 1 || opt.InitAddress[0] != r.Addr || opt.TLSConfig != nil {
		t.Errorf("ClientOption(%q) = %+v", r.URL, opt)
	}
	if _, err := connect(t, opt); err != nil {
		t.Fatal(err)
	}

	// /db selects the database.
	opt, err = ClientOption("redis://" + r.Addr + "/3")
	if err != nil || opt.SelectDB != 3 {
		t.Fatalf("ClientOption(/3) = SelectDB %d, %v", opt.SelectDB, err)
	}
	if _, err := connect(t, opt); err != nil {
		t.Fatal(err)
	}
	key := tenantChecks("conn", rule("fw", limit.FixedWindow, 1, time.Second))[0].Key
	for db, want := range map[int]int64{0: 1, 3: 1, 1: 0} {
		o := r.ClientOption()
		o.SelectDB = db
		c, err := rueidis.NewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		n, err := c.Do(ctxT(t), c.B().Exists().Key(key).Build()).AsInt64()
		c.Close()
		if err != nil || n != want {
			t.Errorf("db %d: EXISTS = %d, %v; want %d", db, n, err, want)
		}
	}

	// Host:port seeds: one standalone server.
	opt, err = ClientOption(r.Addr)
	if err != nil || !opt.DisableCache || len(opt.InitAddress) != 1 {
		t.Fatalf("ClientOption(%q) = %+v, %v", r.Addr, opt, err)
	}
	if _, err := connect(t, opt); err != nil {
		t.Fatal(err)
	}
}

func TestClientOptionAuth(t *testing.T) {
	t.Run("acl_user", func(t *testing.T) {
		r := testenv.StartRedis(t, &testenv.RedisOptions{User: "gate", UserPassword: "s3cret-pw"})
		if !strings.Contains(r.URL, "gate:s3cret-pw@") {
			t.Fatalf("testenv URL %q lacks the user", r.URL)
		}
		opt, err := ClientOption(r.URL)
		if err != nil || opt.Username != "gate" || opt.Password != "s3cret-pw" {
			t.Fatalf("ClientOption = user %q, %v", opt.Username, err)
		}
		if _, err := connect(t, opt); err != nil {
			t.Fatal(err)
		}
		wrong, err := ClientOption(strings.Replace(r.URL, "s3cret-pw", "wrong", 1))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := connect(t, wrong); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("wrong password: %v, want a WRONGPASS error", err)
		}
	})
	t.Run("requirepass", func(t *testing.T) {
		r := testenv.StartRedis(t, &testenv.RedisOptions{Password: "pw-only"})
		opt, err := ClientOption("redis://:pw-only@" + r.Addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := connect(t, opt); err != nil {
			t.Fatal(err)
		}
		opt, _ = ClientOption("redis://:nope@" + r.Addr)
		if _, err := connect(t, opt); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("wrong password: %v, want a WRONGPASS error", err)
		}
		opt, _ = ClientOption(r.Addr) // no password at all
		if _, err := connect(t, opt); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
			t.Errorf("no password: %v, want a NOAUTH error", err)
		}
	})
}

func TestClientOptionTLS(t *testing.T) {
	r := testenv.StartRedis(t, &testenv.RedisOptions{TLS: true})
	if !strings.HasPrefix(r.URL, "rediss://") {
		t.Fatalf("testenv URL %q is not rediss://", r.URL)
	}
	opt, err := ClientOption(r.URL)
	if err != nil {
		t.Fatal(err)
	}
	if opt.TLSConfig == nil || opt.TLSConfig.ServerName != "127.0.0.1" || opt.TLSConfig.InsecureSkipVerify {
		t.Fatalf("ClientOption(rediss) TLSConfig = %+v, want verification of 127.0.0.1", opt.TLSConfig)
	}
	// The system roots do not know the test CA.
	if _, err := connect(t, opt); !errors.As(err, new(x509.UnknownAuthorityError)) {
		t.Errorf("without the test CA: %v, want an unknown authority error", err)
	}
	opt, _ = ClientOption(r.URL)
	opt.TLSConfig.RootCAs = r.TLSConfig().RootCAs
	if _, err := connect(t, opt); err != nil {
		t.Fatal(err)
	}
	// A plain client cannot talk to the TLS port.
	plain, _ := ClientOption(strings.Replace(r.URL, "rediss://", "redis://", 1))
	plain.Dialer.Timeout = time.Second
	if _, err := connect(t, plain); err == nil {
		t.Error("a plain client connected to a TLS-only server")
	}
}

func TestClientOptionErrors(t *testing.T) {
	for _, addrs := range [][]string{
		nil,
		{""},
		{"redis://a:1", "b:2"},
		{"a:1", "redis://b:2"},
		{"ftp://a:1"},
		{"redis://a:1/x"},
	} {
		if opt, err := ClientOption(addrs...); err == nil {
			t.Errorf("ClientOption(%q) = %+v, want an error", addrs, opt)
		}
	}
	_, err := ClientOption("redis://user:topsecret@[::1")
	if err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("bad URL: %v, want an error that does not show the password", err)
	}
}

// TestCluster runs the store on a 6-node Redis Cluster: several seeds, one
// seed (cluster mode detected), the algo parity run across slots, usage
// meters on every master, and cross-slot batches refused without reaching
// the client.
func TestCluster(t *testing.T) {
	cl := testenv.StartCluster(t)

	opt, err := ClientOption(cl.Addrs...)
	if err != nil || len(opt.InitAddress) != len(cl.Addrs) || !opt.DisableCache {
		t.Fatalf("ClientOption(seeds) = %+v, %v", opt, err)
	}
	c, err := connect(t, opt)
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, c, testTimeout)

	t.Run("one_seed", func(t *testing.T) {
		opt, err := ClientOption(cl.Addrs[0])
		if err != nil {
			t.Fatal(err)
		}
		c, err := connect(t, opt)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(c.Nodes()); n < 2 {
			t.Fatalf("client from one seed knows %d node(s): cluster mode not detected", n)
		}
		s := newStore(t, c, testTimeout)
		slots := map[uint16]bool{}
		for i := range 30 { // tenants spread over every master
			checks := tenantChecks(fmt.Sprintf("seed-%d", i), rule("fw", limit.FixedWindow, 5, time.Minute),
				rule("cc", limit.Concurrency, 5, time.Minute))
			d, err := s.Take(ctxT(t), checks, 1)
			if err != nil || !d.Allowed {
				t.Fatalf("tenant %d: %+v, %v", i, d, err)
			}
			if err := s.Release(ctxT(t), checks, d.Lease); err != nil {
				t.Fatal(err)
			}
			slots[keyspace.Slot(checks[0].Key)] = true
		}
		t.Logf("%d slots used", len(slots))
	})

	t.Run("cross_slot", func(t *testing.T) {
		// The cluster client itself panics on a cross-slot command; the
		// store must refuse the batch first.
		checks := append(tenantChecks("x1", rule("fw", limit.FixedWindow, 5, time.Second)),
			tenantChecks("x2", rule("gc", limit.GCRA, 5, time.Second))...)
		if _, err := s.Take(ctxT(t), checks, 1); !errors.Is(err, ErrCrossSlot) {
			t.Errorf("Take: %v, want ErrCrossSlot", err)
		}
	})

	t.Run("matches_algo", func(t *testing.T) {
		matchRandom(t, c, s, 100, false)
	})

	t.Run("meters", func(t *testing.T) { testClusterMeters(t, c, s) })

	// Every key written on any master has a TTL.
	for i, n := range cl.Nodes {
		nc := n.Client(t)
		role, err := nc.Do(ctxT(t), nc.B().Role().Build()).ToArray()
		if err != nil || len(role) == 0 {
			t.Fatalf("ROLE: %v", err)
		}
		if r, _ := role[0].ToString(); r == "master" {
			t.Logf("node %d: %d keys, all with a TTL", i, allKeysExpire(t, nc))
		}
	}
}

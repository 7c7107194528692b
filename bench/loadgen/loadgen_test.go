package loadgen

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

func startEnv(t *testing.T, rules string) *Env {
	t.Helper()
	srv := testenv.StartRedis(t, nil)
	e, err := Start(context.Background(), &Options{Rules: rules, RedisAddr: srv.Addr, Tenants: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	if err := e.Exhaust(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestRun drives every target briefly: each answers every call with its
// expected status (Run fails otherwise), and the report names them all.
func TestRun(t *testing.T) {
	for _, rules := range []string{RulesLayered, RulesSingle} {
		t.Run(rules, func(t *testing.T) {
			e := startEnv(t, rules)
			var names []string
			for _, tg := range e.Targets {
				names = append(names, tg.Name)
			}
			if want := []string{Direct, GatewayMem, GatewayRed, DenyMem, DenyRedis}; strings.Join(names, " ") != strings.Join(want, " ") {
				t.Fatalf("targets %v, want %v", names, want)
			}
			res, err := Run(context.Background(), e, RunOptions{Workers: 4, Rounds: 1, Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range names {
				r := res.Rounds[name][0]
				if r.Calls == 0 || r.Errors != 0 || r.P50 <= 0 || r.P99 < r.P50 {
					t.Errorf("%s: %+v", name, r)
				}
			}
			var b strings.Builder
			res.Print(&b)
			for _, name := range names {
				if !strings.Contains(b.String(), "| "+name+" ") {
					t.Errorf("report lacks %s:\n%s", name, b.String())
				}
			}
		})
	}
}

// TestDriveCountsWrongStatus holds Drive to its contract: a call that does
// not get the expected status is an error, not a counted call.
func TestDriveCountsWrongStatus(t *testing.T) {
	e := startEnv(t, RulesSingle)
	tg, ok := e.Target(GatewayMem)
	if !ok {
		t.Fatal("no gateway-mem target")
	}
	tg.Status = http.StatusTooManyRequests // it answers 200
	r := Drive(context.Background(), tg, 2, 0, 100*time.Millisecond)
	if r.Calls != 0 || r.Errors == 0 || !strings.Contains(r.FirstError, "status 200") {
		t.Fatalf("got %+v, want only errors", r)
	}
	if _, err := Run(context.Background(), e, RunOptions{Targets: []string{"nope"}}); err == nil {
		t.Fatal("Run accepted an unknown target")
	}
}

func TestStartRejectsUnknownRules(t *testing.T) {
	if _, err := Start(context.Background(), &Options{Rules: "bogus"}); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("err = %v", err)
	}
}

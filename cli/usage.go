package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
	usagestore "github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// Bounds of the usage commands' I/O. Init may wait for a new DynamoDB table
// to become ACTIVE.
const (
	usageReadTimeout = 30 * time.Second
	usageInitTimeout = 5 * time.Minute
)

// runUsage implements
//
//	mcpgate usage --config FILE --tenant T [--period YYYY-MM] [--tier NAME] [--json]
//	mcpgate usage init --config FILE
//
// The first prints a tenant's usage in a billing period as the durable usage
// store (usage.store of the config) holds it; the second creates that
// store's table.
func runUsage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "init" {
		return runUsageInit(ctx, args[1:], stdout, stderr)
	}
	fs := newFlags("usage", stderr)
	path := fs.String("config", "", "config file naming the usage store (required)")
	tenant := fs.String("tenant", "", "tenant to report (required)")
	period := fs.String("period", "", "billing period `YYYY-MM` (default: the current month, UTC)")
	tierName := fs.String("tier", "", "tier whose monthly_quota is the quota shown (default: the config's default_tier)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.Usage = func() { usageHelp(fs) }
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" || *tenant == "" {
		fmt.Fprintln(stderr, "mcpgate usage: --config FILE and --tenant T are required")
		return errUsage
	}
	if *period == "" {
		*period = usagestore.Period(time.Now())
	}
	if _, err := usagestore.PeriodEnd(*period); err != nil {
		fmt.Fprintf(stderr, "mcpgate usage: --period: %v\n", err)
		return errUsage
	}
	cfg, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	// The tier is the token's claim at call time, which the command cannot
	// know: it is asked for, or taken to be the default one.
	tier, t, ok := cfg.ResolveTier(*tierName)
	if *tierName != "" && tier != *tierName {
		fmt.Fprintf(stderr, "mcpgate usage: --tier: no tier %q in %s (tiers: %s)\n", *tierName, *path, strings.Join(sortedTiers(cfg), ", "))
		return errUsage
	}
	if !ok {
		tier = "" // no tiers configured: no quota
	}

	ctx, cancel := context.WithTimeout(ctx, usageReadTimeout)
	defer cancel()
	spec := cfg.Usage.Store
	if kind, target := cfg.Usage.Backend(); kind == "sqlite" {
		// Reading must not leave an empty database behind a typo.
		if _, err := os.Stat(target); err != nil {
			return fmt.Errorf("usage store %s: %w (nothing flushed yet? mcpgate serve creates it, or create it now with: mcpgate usage init --config %s)", spec, err, *path)
		}
	}
	st, err := setup.OpenUsageStore(ctx, spec)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Check(ctx); err != nil {
		if errors.Is(err, usagestore.ErrNotInitialized) {
			return fmt.Errorf("usage store %s is not initialized (run: mcpgate usage init --config %s): %w", spec, *path, err)
		}
		return err
	}
	rec, found, err := st.Get(ctx, *tenant, *period)
	if err != nil {
		return err
	}
	var updated *time.Time
	if found {
		updated = &rec.UpdatedAt
	}
	r := usagestore.NewReport(*tenant, *period, tier, t.MonthlyQuota, rec.Usage, updated, spec)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	printReport(stdout, r)
	return nil
}

func printReport(w io.Writer, r usagestore.Report) {
	fmt.Fprintf(w, "tenant %s, period %s (until %s)\n", r.Tenant, r.Period, r.PeriodEnd.Format(time.RFC3339))
	switch {
	case r.Quota > 0:
		fmt.Fprintf(w, "used:  %d of %d cost units (%.1f%%, tier %s), %d left\n",
			r.Used, r.Quota, 100*float64(r.Used)/float64(r.Quota), r.Tier, *r.Remaining)
	case r.Tier != "":
		fmt.Fprintf(w, "used:  %d cost units (tier %s has no quota)\n", r.Used, r.Tier)
	default:
		fmt.Fprintf(w, "used:  %d cost units (no tiers configured: no quota)\n", r.Used)
	}
	fmt.Fprintf(w, "calls: %d (%d admitted, %d taken back)\n", r.Calls, r.CallsAdmitted, r.RefundedCalls)
	if r.Found {
		fmt.Fprintf(w, "as of: %s in %s\n", r.UpdatedAt.UTC().Format(time.RFC3339), r.Store)
	} else {
		fmt.Fprintf(w, "as of: nothing recorded in %s for this tenant and period\n", r.Store)
	}
}

func usageHelp(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprint(w, `Usage:
  mcpgate usage --config FILE --tenant T [--period YYYY-MM] [--tier NAME] [--json]
  mcpgate usage init --config FILE

The first form prints a tenant's usage in a billing period (a calendar month,
UTC) from the durable usage store named by usage.store in the config. Those
totals lag the gateways' live counters by up to usage.flush_interval. The quota
shown is the monthly_quota of --tier: the tier of a call comes from its token,
which this command cannot see, so it defaults to the config's default_tier.
With --json it prints one object with at least tenant, period, used, quota
(0: no quota) and calls.

The second form creates the usage store's table (SQLite file or DynamoDB
table); it is idempotent. Only DynamoDB needs it: mcpgate serve creates or
upgrades an SQLite file's schema itself.

Flags:
`)
	fs.PrintDefaults()
}

func runUsageInit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("usage init", stderr)
	path := fs.String("config", "", "config file naming the usage store (required)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "mcpgate usage init: --config FILE is required")
		return errUsage
	}
	cfg, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, usageInitTimeout)
	defer cancel()
	spec := cfg.Usage.Store
	st, err := setup.OpenUsageStore(ctx, spec)
	if err != nil {
		return err
	}
	defer st.Close()
	if s, ok := st.(*sqlite.Store); ok {
		// Opening the file brought its schema up to date.
		if err := s.Check(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "usage store %s: %s\n", spec, setup.DescribeMigration(s.Migration()))
		return nil
	}
	err = st.Check(ctx)
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "usage store %s: already initialized, nothing to do\n", spec)
		return nil
	case !errors.Is(err, usagestore.ErrNotInitialized):
		return err
	}
	if err := st.Init(ctx); err != nil {
		return err
	}
	if err := st.Check(ctx); err != nil {
		return fmt.Errorf("usage store %s: initialized, but: %w", spec, err)
	}
	_, table := cfg.Usage.Backend()
	fmt.Fprintf(stdout, "usage store %s: created the DynamoDB table %s (on-demand billing) and it is ACTIVE\n", spec, table)
	return nil
}

// loadConfig loads and validates the config, printing its problems.
func loadConfig(path string, stderr io.Writer) (*policy.Config, error) {
	cfg, err := policy.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, errReported
	}
	return cfg, nil
}

func sortedTiers(cfg *policy.Config) []string {
	names := make([]string, 0, len(cfg.Tiers))
	for n := range cfg.Tiers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

package cli

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/mcpgate/mcpgate/policy"
)

func runCheck(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("check", stderr)
	path := fs.String("config", "", "config file to validate (required)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "mcpgate check: --config FILE is required")
		return errUsage
	}
	cfg, err := policy.Load(*path)
	if err != nil {
		// policy errors print one "file:line: field: problem" per line.
		fmt.Fprintln(stderr, err)
		return errReported
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	for _, n := range inactiveFeatures(cfg) {
		fmt.Fprintln(stderr, "note:", n)
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	return nil
}

// inactiveFeatures lists configured features this version accepts but does
// not enforce yet, so that nobody believes they are protected by them.
func inactiveFeatures(cfg *policy.Config) []string {
	var out []string
	for name, t := range cfg.Tiers {
		if t.MonthlyQuota > 0 {
			out = append(out, fmt.Sprintf("tiers.%s.monthly_quota is accepted but not enforced yet (usage metering is not active)", name))
		}
	}
	for name, t := range cfg.Tools {
		if t.Cache != nil || len(t.Invalidates) > 0 {
			out = append(out, fmt.Sprintf("tools.%s: result caching is accepted but not active yet", name))
		}
		if t.Cost.FromResult != "" {
			out = append(out, fmt.Sprintf("tools.%s.cost.from_result is accepted but not applied yet: the estimate is charged", name))
		}
	}
	if len(cfg.Cache.Warm) > 0 {
		out = append(out, "cache.warm is accepted but not active yet")
	}
	if cfg.Breaker.Enabled() {
		out = append(out, "breaker is accepted but not active yet")
	}
	slices.Sort(out)
	return out
}

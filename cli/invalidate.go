package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/policy"
)

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// runInvalidate wraps POST /admin/cache/invalidate of a running gateway.
func runInvalidate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("invalidate", stderr)
	path := fs.String("config", "", "config of the running gateway: gives its address and admin token variable")
	url := fs.String("url", "", "base URL of the gateway (default: http://<listen> from --config)")
	tokenEnv := fs.String("token-env", "", "environment variable holding the admin token (default: auth.admin_token_env from --config)")
	tenant := fs.String("tenant", "", "tenant whose entries to drop (required)")
	var tags stringList
	fs.Var(&tags, "tag", "tag to invalidate, e.g. product:42 (repeatable, at least one)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *tenant == "" || len(tags) == 0 {
		fmt.Fprintln(stderr, "mcpgate invalidate: --tenant T and at least one --tag are required")
		return errUsage
	}
	if *path != "" {
		cfg, err := policy.Load(*path)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return errReported
		}
		if *url == "" {
			*url = "http://" + cfg.Listen
		}
		if *tokenEnv == "" {
			*tokenEnv = cfg.Auth.AdminTokenEnv
		}
	}
	if *url == "" || *tokenEnv == "" {
		fmt.Fprintln(stderr, "mcpgate invalidate: give --config FILE, or --url and --token-env")
		return errUsage
	}
	token := os.Getenv(*tokenEnv)
	if token == "" {
		return fmt.Errorf("environment variable %s (the admin token) is empty", *tokenEnv)
	}
	body, _ := json.Marshal(map[string]any{"tenant": *tenant, "tags": []string(tags)})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(*url, "/")+"/admin/cache/invalidate", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("gateway answered %s: %s", resp.Status, bytes.TrimSpace(out))
	}
	_, err = stdout.Write(out)
	return err
}

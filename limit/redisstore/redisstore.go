// Package redisstore is the limit.Store that keeps rate-limit counters in
// Redis, Valkey or Redis Cluster, shared by every gateway instance, through
// the rueidis client.
//
// One Lua script evaluates a whole batch of checks (all the checks of one
// request) atomically on the server: it first evaluates every check without
// writing, then, only if every enforced check allows, charges every check
// that allows. A denied request writes nothing. The script is a port of the
// reference algorithms (limit/internal/algo): the Redis store and the memory
// store give the same decisions.
//
// Time is the Redis server's clock (TIME, read inside the script), never the
// gateway's, so gateways with skewed clocks agree. It is counted in
// microseconds since 2020-01-01T00:00:00Z.
//
// Keys and their state (one key per check, named by package keyspace):
//
//	fixed_window            string "<window start> <count>"
//	sliding_window_counter  string "<window start> <count> <previous window's count>"
//	token_bucket            string "<tokens×period µs> <time>"
//	gcra                    string "<theoretical arrival time>"
//	sliding_window          sorted set, one member per unit, scored by its time
//	concurrency             sorted set, lease id scored by the lease's expiry
//	usage meter             hash: live and flushed usage, tenant, period
//	loop breaker            hash: phase, times, counts, reason (breaker.lua)
//	identical-calls counter string "<end of window> <count>"
//
// It is a limit.MeteredStore: a usage meter (see TakeMetered) is charged by
// the same script as the checks of its call, so a monthly quota is exact
// across every gateway sharing the Redis. A batch without a meter runs
// exactly as before and pays nothing for meters.
//
// It is a limit.GuardedStore: a loop breaker (see Evaluate) is read,
// evaluated and updated by the same script as the checks and the meter of
// its call, so watching for runaway agents costs no extra round trip. A
// call without a breaker runs exactly as before.
//
// Every key written gets its TTL in the same script (for a counter, the time
// until it is back to full capacity, in milliseconds rounded up; for a
// meter, its Meter.ExpireAt), so idle counters cost no memory. Use an eviction policy that cannot evict these
// keys (noeviction): an evicted counter admits what it should deny.
//
// In Redis Cluster, one script can only touch keys of one slot: the checks of
// one call must share a hash tag (keyspace puts all of a tenant's counters in
// the tenant's slot). A batch that does not fails with ErrCrossSlot before
// any I/O.
//
// Calls are never replayed. The library runs as a Redis Function (FUNCTION
// LOAD on first use, then FCALL); where functions are unavailable, or with
// Options.NoFunctions, as a script run with EVALSHA and sent again with EVAL
// only after an explicit NOSCRIPT reply. Either way code is sent again only
// after the server said it was missing (nothing was run).
// rueidis retries only read-only commands after network errors, and these
// are not: a call that failed or timed out may have been applied once, never
// twice. A metered call with an op id (limit.Meter.Op) may be sent again by
// its caller: the script records the op with the meter's charge, and a
// repeat applies nothing (see limit.lua). Keep rueidis.ClientOption.ConnLifetime at 0: when a connection
// reaches its lifetime, rueidis resends commands still waiting for a reply.
package redisstore

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// DefaultTimeout is the deadline of one Take, Refund or Release when
// Options.Timeout is 0: a rate-limit decision must not hold a request for
// long, and the gateway's failure policy takes over on a timeout.
const DefaultTimeout = 25 * time.Millisecond

// Options configures a Store. A nil *Options means all defaults.
type Options struct {
	// Timeout is the deadline of one Take, Refund or Release, on top of any
	// deadline of the caller's context. 0 means DefaultTimeout.
	Timeout time.Duration
	// NoFunctions runs the store's library as a script (EVALSHA, EVAL after
	// NOSCRIPT) even where the server has Redis Functions. By default the
	// store loads it as a function library (FUNCTION LOAD, on first use)
	// and calls it with FCALL, falling back to the script where FUNCTION
	// LOAD is refused (Redis < 7, a user without the permission).
	NoFunctions bool
	// Logger receives what the store cannot return: a refund of half a
	// request that failed (see Evaluate with global checks on a Cluster),
	// and on a Cluster the slots whose calls are detoured to the node that
	// took them over (see detour.go). nil means slog.Default().
	Logger *slog.Logger

	// soloKeep is the keeper's PING interval on the lone calls' idle
	// connection; 0 means defaultSoloKeep (tests set it).
	soloKeep time.Duration
}

// ErrCrossSlot means the checks of one batch are not all in one Redis
// Cluster slot, so no script can evaluate them atomically. Build their keys
// with one hash tag (package keyspace does, per tenant). It is reported for
// every server kind, standalone too, so that a configuration that works in
// development also works on a cluster.
var ErrCrossSlot = errors.New("redisstore: checks of one batch are in different cluster slots")

// errReply means the script answered something the store does not expect.
var errReply = fmt.Errorf("%w: unexpected script reply", limit.ErrStoreRefused)

//go:embed limit.lua
var limitSource string

//go:embed breaker.lua
var breakerSource string

// breakerMark is the line of limit.lua where breaker.lua goes.
const breakerMark = "--[[breaker.lua]]"

// librarySource is the library every call runs (limit.lua with the loop
// breakers' part, breaker.lua, spliced in): one library, so that a call
// with a breaker is still one call over one slot. It defines run(keys,
// args); the two forms below serve it.
var librarySource = splice(limitSource, breakerMark, breakerSource)

// libraryID names this version of the library: Redis Functions are named,
// not hashed, so gateways of two versions sharing one Redis (a rolling
// upgrade) each call their own library.
var libraryID = func() string {
	sum := sha1.Sum([]byte(librarySource))
	return hex.EncodeToString(sum[:6])
}()

// functionName is the Redis Function that runs a call (FCALL), and
// functionSource the library that registers it (FUNCTION LOAD): built once,
// when the library loads, so that a call runs only run and what it calls.
var (
	functionName   = "mcpgate_limit_" + libraryID
	functionSource = "#!lua name=mcpgate_" + libraryID + "\nlocal LIB, EOP = true, nil\n" + librarySource +
		"\nredis.register_function('" + functionName + "', run)\n"
)

// scriptSource is the same library as a script (EVALSHA, and EVAL after
// NOSCRIPT), for servers without functions (Redis < 7) and users not
// allowed FUNCTION LOAD. Its body runs on every call; it builds the
// meters' and the breakers' functions only for the ops that use them.
// Redis < 5 needs effects replication to write after TIME; later versions
// always replicate effects (and Redis 7 makes the call a no-op).
var scriptSource = "if redis.replicate_commands then redis.replicate_commands() end\n" +
	"local LIB, EOP, EKEYS, EARGV = false, string.sub(ARGV[1], 1, 1), KEYS, ARGV\n" + librarySource + "\nreturn run(EKEYS, EARGV)\n"

// scriptSHA is scriptSource's SHA-1, for EVALSHA.
var scriptSHA = func() string {
	sum := sha1.Sum([]byte(scriptSource))
	return hex.EncodeToString(sum[:])
}()

// Script returns the store's library as the script it runs where Redis
// Functions are missing (EVALSHA, EVAL), with the KEYS and ARGV limit.lua
// documents: for tools and benchmarks that run it bare.
func Script() string { return scriptSource }

func splice(src, mark, part string) string {
	if strings.Count(src, mark) != 1 {
		panic("redisstore: limit.lua must hold the line " + mark + " exactly once")
	}
	return strings.Replace(src, mark, part, 1)
}

// Script operations (the first field of ARGV[1], the header).
const (
	opTake        = "t"
	opRefund      = "r"
	opRelease     = "l"
	opRenew       = "e"
	opTakeMetered = "m"
	opAdjust      = "a"
	opUndoMetered = "U" // has an op (limit.lua): no lower-case form
	opMarkFlushed = "f"
	// loop breakers (breaker.lua)
	opTakeBreaker        = "b"
	opTakeMeteredBreaker = "n"
	opReport             = "o"
	opAddDenials         = "d"
	opResetBreaker       = "x"
)

// Store is a limit.Store on Redis. It is safe for concurrent use by many
// goroutines, and any number of gateways may share the same Redis. The zero
// Store is not usable: build one with New.
type Store struct {
	client  rueidis.Client
	timeout time.Duration
	cluster bool // a Cluster client: keys of different slots need calls of their own
	lib     library
	detours detours // Cluster slots whose master failed (see detour.go)
	log     *slog.Logger
	// offset is added, in microseconds, to the Redis time the script reads.
	// Always 0 in production; tests move the store's clock forward with it
	// instead of sleeping.
	offset atomic.Int64
	// inflight counts the calls under way (standalone and Sentinel
	// clients), and soloConn keeps the connection of lone calls (see solo.go).
	inflight atomic.Int64
	soloConn soloConn
	lost     lostLeases // releases of the slots failed calls may hold (see lostlease.go)
}

var _ limit.GuardedStore = (*Store)(nil)

// New returns a Store that runs its scripts on client, which may be a
// standalone, Cluster or Sentinel client (see ClientOption). The Store does
// not own client: closing it is the caller's job.
func New(client rueidis.Client, opts *Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: nil client")
	}
	s := &Store{client: client, timeout: DefaultTimeout, cluster: client.Mode() == rueidis.ClientModeCluster, log: slog.Default()}
	s.lost.init()
	if opts != nil && opts.NoFunctions {
		s.lib.mode.Store(modeScripts)
	}
	if opts != nil && opts.Logger != nil {
		s.log = opts.Logger
	}
	if opts != nil {
		switch {
		case opts.Timeout < 0:
			return nil, fmt.Errorf("redisstore: negative timeout %v", opts.Timeout)
		case opts.Timeout > 0:
			s.timeout = opts.Timeout
		}
	}
	if !s.cluster {
		keep := defaultSoloKeep
		if opts != nil && opts.soloKeep > 0 {
			keep = opts.soloKeep
		}
		s.soloConn.start(s, keep)
	}
	return s, nil
}

// Timeout is the deadline the store puts on one operation
// (Options.Timeout): a caller that wraps the store tells from it whether a
// timeout was the store's own or its caller's shorter deadline.
func (s *Store) Timeout() time.Duration { return s.timeout }

// Close ends the store's background work (on a Cluster, the watch of
// slots whose calls got no answer, see detour.go; otherwise the dial of
// the lone calls' connection, see solo.go) and waits for it: at most a
// look's deadline or a PING's, plus the client's dial timeout, for a
// question left out to a hung node. It does not close the client. Calls
// made after Close still work, without detours, all through the client's
// pipeline.
func (s *Store) Close() {
	s.lost.close()
	s.detours.stop()
	s.soloConn.stop()
}

// Ping reports whether the store's Redis answers a PING, by the end of ctx
// whatever the client does (see bounded). On a Cluster the PING goes to every
// node the client knows at once, and succeeds when any node answers it: a
// PING sent the Cluster way goes to one node picked at random, and one
// that hung keeps it past its deadline. It is the probe of a breaker around
// the store (the gateway's store.on_error); the breaker's next calls say
// whether their slots are served.
func (s *Store) Ping(ctx context.Context) error {
	nodes := map[string]rueidis.Client{"": s.client}
	if s.cluster {
		nodes = s.client.Nodes()
	}
	answers := make(chan error, len(nodes)) // never blocks a sender
	for _, c := range nodes {
		go func() { answers <- c.Do(ctx, c.B().Ping().Build()).Error() }()
	}
	err := errors.New("redisstore: no node to ping")
	for range nodes {
		select {
		case err = <-answers:
			if err == nil {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("redisstore: ping: %w", ctx.Err())
		}
	}
	return fmt.Errorf("redisstore: ping: %w", err)
}

// TopologyRefresh is how often a Cluster client made from ClientOption
// reads the slot map when nothing made it do so sooner.
const TopologyRefresh = time.Minute

// ClientOption returns the rueidis options of a client for a Store.
//
// One address with a scheme is a URL parsed by rueidis.ParseURL:
// redis://[user:password@]host:port[/db], rediss:// for TLS, valkey://,
// valkeys://, unix://, with the query options ParseURL documents (addr= for
// more cluster seeds, dial_timeout=, ...). Otherwise the addresses are
// host:port seeds: one is a standalone server or any node of a cluster
// (rueidis asks the server which it is), several are nodes of one cluster.
//
// Besides what the URL says, ClientOption sets DisableCache (the store never
// reads through client-side caching, so it need not track keys), and, unless
// the URL sets them (dial_timeout=, write_timeout=), a dial timeout and a
// connection read/write timeout of 1s each instead of rueidis's 5s
// and 10s. The second is what detects a server that hangs or sits behind a
// partition (its connection open and silent): the store's own deadline
// (Options.Timeout) only ends the call, it neither closes the connection nor
// makes a cluster client refresh its slot map, so with rueidis's 10s a
// Cluster whose master hung went on routing that master's slots to it for
// about 8s after the failover (measured in internal/faults,
// TestClusterFailoverRecovery; 1s is under any cluster-node-timeout, so the
// dead connection is gone by the time a replica is promoted). Every command
// of the store and the cache is small, far below a second. On a Cluster it
// also has the client read the slot map every TopologyRefresh: a client
// knows the nodes the map listed when it last read it, and the store can
// only detour a failed master's calls (see detour.go) to a replica the client
// knows, so one that joined later must not stay unknown. It leaves retries
// enabled: rueidis retries read-only commands only, never the store's
// scripts. ConnLifetime stays 0, as the package documentation requires.
//
// For rediss:// the returned TLSConfig verifies the server against the
// system's roots with the URL's host as server name; to trust a private CA
// (or a client certificate), set opt.TLSConfig.RootCAs (or Certificates)
// before calling rueidis.NewClient. For host:port seeds, set opt.TLSConfig
// to use TLS, and opt.Username and opt.Password to authenticate.
func ClientOption(addrs ...string) (rueidis.ClientOption, error) {
	// A connection whose server answers nothing (not even rueidis's
	// keep-alive PING) for this long is closed, which also makes a cluster
	// client refresh its slot map; a dial gives up after as long.
	const connTimeout = time.Second
	if len(addrs) == 0 {
		return rueidis.ClientOption{}, errors.New("redisstore: no Redis address")
	}
	if len(addrs) == 1 && strings.Contains(addrs[0], "://") {
		opt, err := rueidis.ParseURL(addrs[0])
		if err != nil {
			// url.Parse's errors quote the whole URL, password included.
			if uerr, ok := errors.AsType[*url.Error](err); ok {
				err = uerr.Err
			}
			return rueidis.ClientOption{}, fmt.Errorf("redisstore: invalid Redis URL: %w", err)
		}
		opt.DisableCache = true
		if opt.Dialer.Timeout == 0 {
			opt.Dialer.Timeout = connTimeout
		}
		if opt.ConnWriteTimeout == 0 {
			opt.ConnWriteTimeout = connTimeout
		}
		if opt.ClusterOption.ShardsRefreshInterval == 0 {
			opt.ClusterOption.ShardsRefreshInterval = TopologyRefresh
		}
		return opt, nil
	}
	seeds := make([]string, len(addrs))
	for i, a := range addrs {
		if a == "" || strings.Contains(a, "://") {
			return rueidis.ClientOption{}, fmt.Errorf("redisstore: invalid Redis address %q: want host:port (a URL must be the only address)", a)
		}
		seeds[i] = a
	}
	opt := rueidis.ClientOption{InitAddress: seeds, DisableCache: true, ConnWriteTimeout: connTimeout}
	opt.Dialer.Timeout = connTimeout
	opt.ClusterOption.ShardsRefreshInterval = TopologyRefresh
	return opt, nil
}

// Take evaluates checks for one request of cost units, atomically: if every
// enforced check allows, every check that allows is charged and each
// concurrency check takes a slot under the returned Decision.Lease;
// otherwise nothing is charged.
//
// An error means no decision. It may still mean the request was charged: a
// call that timed out (Options.Timeout or ctx) may have run on the server
// after the deadline; it is never sent twice. Errors wrap ErrCrossSlot,
// limit.ErrInvalidRule (limit.ErrDuplicateKey), limit.ErrInvalidCost,
// limit.ErrNoChecks, context.DeadlineExceeded or the client's error.
func (s *Store) Take(ctx context.Context, checks []limit.Check, cost int64) (limit.Decision, error) {
	results, lease, _, err := s.take(ctx, checks, cost)
	if err != nil {
		return limit.Decision{}, err
	}
	return limit.Combine(checks, results, lease), nil
}

// take is Take returning the script's clock too (for tests).
func (s *Store) take(ctx context.Context, checks []limit.Check, cost int64) (results []limit.Result, lease string, now int64, err error) {
	if err := validate(checks, cost); err != nil {
		return nil, "", 0, fmt.Errorf("redisstore: take: %w", err)
	}
	if hasConcurrency(checks) {
		lease = newLease()
	}
	arr, err := s.run(ctx, opTake, checks, cost, lease)
	if err != nil {
		s.releaseLost(lease, checks)
		return nil, "", 0, fmt.Errorf("redisstore: take: %w", err)
	}
	if len(arr) != 1+4*len(checks) {
		return nil, "", 0, fmt.Errorf("redisstore: take: %w: %d values for %d checks", errReply, len(arr), len(checks))
	}
	now, results, err = parseResults(arr, len(checks))
	if err != nil {
		return nil, "", 0, fmt.Errorf("redisstore: take: %w", err)
	}
	return results, lease, now, nil
}

// parseResults reads the script's clock and n check results from the start
// of a take reply, which has at least 1+4n values.
func parseResults(arr []rueidis.RedisMessage, n int) (now int64, results []limit.Result, err error) {
	now, err = arr[0].AsInt64()
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %w", errReply, err)
	}
	results = make([]limit.Result, n)
	for i := range results {
		var v [4]int64
		for j := range v {
			if v[j], err = arr[1+4*i+j].AsInt64(); err != nil {
				return 0, nil, fmt.Errorf("%w: %w", errReply, err)
			}
		}
		results[i] = limit.Result{Allowed: v[0] == 1, Remaining: v[1], ResetAfter: dur(v[2]), RetryAfter: dur(v[3])}
	}
	return now, results, nil
}

// Refund gives back, atomically over the batch, what an admitted request
// charged: cost units of every check given, and the concurrency slots held
// under lease. Pass the checks Take charged: those whose Result allowed (a
// shadow check that denied was not charged, and refunding it would credit
// units it never gave). As with Take, an error may mean the refund was
// applied (once, never twice).
func (s *Store) Refund(ctx context.Context, checks []limit.Check, cost int64, lease string) error {
	_, err := s.refundAt(ctx, checks, cost, lease, -1)
	return err
}

// refundAt is Refund for a request taken at at, the script's clock its take
// replied ("now"; negative: unknown, as Refund): it gives back the units
// that take charged (algo.RefundAt), even when the counter moved since (a
// later request's units in a sliding window, the next window of a sliding
// window counter). It returns the refund's clock.
func (s *Store) refundAt(ctx context.Context, checks []limit.Check, cost int64, lease string, at int64) (now int64, err error) {
	if err := validate(checks, cost); err != nil {
		return 0, fmt.Errorf("redisstore: refund: %w", err)
	}
	b := batches.Get().(*batch)
	defer b.release()
	b.refund(s.offset.Load(), checks, cost, lease, at)
	arr, err := s.exec(ctx, b)
	if err == nil {
		now, err = scriptClock(arr)
	}
	if err != nil {
		return 0, fmt.Errorf("redisstore: refund: %w", err)
	}
	return now, nil
}

// refund lays out a refund of checks taken at at (negative: unknown, and
// not sent) as limit.lua documents it.
func (b *batch) refund(offset int64, checks []limit.Check, cost int64, lease string, at int64) {
	b.build(opRefund, offset, checks, cost, lease)
	if at >= 0 {
		b.nums(at)
	}
}

// Release frees the concurrency slots held under lease by checks (other
// algorithms are unaffected). Releasing twice, or an expired lease, is
// harmless. With an empty lease, or no concurrency check, it does no I/O.
func (s *Store) Release(ctx context.Context, checks []limit.Check, lease string) error {
	if err := validate(checks, 1); err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if lease == "" || !hasConcurrency(checks) {
		return nil
	}
	arr, err := s.run(ctx, opRelease, checks, 1, lease)
	if err == nil {
		_, err = scriptClock(arr)
	}
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	return nil
}

// Renew implements limit.Renewer: the concurrency slots held under lease
// get a full period from now (Redis time), in one script. With no
// concurrency check it does no I/O and reports held.
func (s *Store) Renew(ctx context.Context, checks []limit.Check, lease string) (bool, error) {
	if err := validate(checks, 1); err != nil {
		return false, fmt.Errorf("redisstore: renew: %w", err)
	}
	want := 0
	for _, c := range checks {
		if c.Rule.Algorithm == limit.Concurrency {
			want++
		}
	}
	if want == 0 || lease == "" {
		return want == 0, nil
	}
	arr, err := s.run(ctx, opRenew, checks, 1, lease)
	if err == nil && len(arr) != 2 {
		err = fmt.Errorf("%w: %d values", errReply, len(arr))
	}
	var n int64
	if err == nil {
		n, err = arr[1].AsInt64()
	}
	if err != nil {
		return false, fmt.Errorf("redisstore: renew: %w", err)
	}
	return n == int64(want), nil
}

func hasConcurrency(checks []limit.Check) bool {
	for _, c := range checks {
		if c.Rule.Algorithm == limit.Concurrency {
			return true
		}
	}
	return false
}

// validate checks a batch, including that one script may run it.
func validate(checks []limit.Check, cost int64) error {
	if err := limit.Validate(checks, cost); err != nil {
		return err
	}
	if len(checks) == 1 {
		return nil // one key is always in one slot (and hashing it costs a CRC per call)
	}
	slot := keyspace.Slot(checks[0].Key)
	for _, c := range checks[1:] {
		if keyspace.Slot(c.Key) != slot {
			return fmt.Errorf("%w: %q and %q", ErrCrossSlot, checks[0].Key, c.Key)
		}
	}
	return nil
}

func scriptClock(arr []rueidis.RedisMessage) (int64, error) {
	if len(arr) != 1 {
		return 0, fmt.Errorf("%w: %d values", errReply, len(arr))
	}
	return arr[0].AsInt64()
}

// dur converts the script's microseconds; negative means never, as in algo.
func dur(us int64) time.Duration {
	if us < 0 {
		return limit.Never
	}
	return time.Duration(us) * time.Microsecond
}

// newLease returns 16 random bytes in hex.
func newLease() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (Go 1.24+): it aborts the program instead
	return hex.EncodeToString(b[:])
}

// run executes the script for one batch under the store's deadline.
func (s *Store) run(ctx context.Context, op string, checks []limit.Check, cost int64, lease string) ([]rueidis.RedisMessage, error) {
	b := batches.Get().(*batch)
	defer b.release()
	b.build(op, s.offset.Load(), checks, cost, lease)
	return s.exec(ctx, b)
}

// batch holds the KEYS and ARGV of one script call; pooled so that the hot
// path allocates only the one string holding every number.
type batch struct {
	keys, args []string
	buf        []byte
	ends       []int
}

var batches = sync.Pool{New: func() any { return new(batch) }}

// release returns b to the pool without keeping its strings alive.
func (b *batch) release() {
	clear(b.keys)
	clear(b.args)
	batches.Put(b)
}

// algCodes are the script's names of the algorithms: a letter, upper case
// for a shadow rule.
var algCodes = map[limit.Algorithm][2]byte{
	limit.FixedWindow:          {'f', 'F'},
	limit.SlidingWindowCounter: {'c', 'C'},
	limit.TokenBucket:          {'t', 'T'},
	limit.GCRA:                 {'g', 'G'},
	limit.SlidingWindow:        {'w', 'W'},
	limit.Concurrency:          {'k', 'K'},
}

// algCode is the script's name of an algorithm (validated before).
func algCode(a limit.Algorithm, shadow bool) byte {
	if shadow {
		return algCodes[a][1]
	}
	return algCodes[a][0]
}

// build lays out KEYS and ARGV as limit.lua documents them: the header
// "<op> <offset> <cost>[ <lease>]" and each check's rule, "<algorithm>
// <limit> <period> <capacity>", one argument each, since every argument
// costs the server as much as parsing one (docs/benchmarks.md, F.4). They
// are formatted into one buffer, turned into one string, and sliced from it.
func (b *batch) build(op string, offset int64, checks []limit.Check, cost int64, lease string) {
	buf, ends := b.buf[:0], b.ends[:0]
	buf = append(buf, op...)
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, offset, 10)
	buf = append(buf, ' ')
	buf = strconv.AppendInt(buf, cost, 10)
	if lease != "" {
		buf = append(buf, ' ')
		buf = append(buf, lease...)
	}
	ends = append(ends, len(buf))
	for _, c := range checks {
		buf = append(buf, algCode(c.Rule.Algorithm, c.Rule.Shadow), ' ')
		buf = strconv.AppendInt(buf, c.Rule.Limit, 10)
		buf = append(buf, ' ')
		buf = strconv.AppendInt(buf, c.Rule.Period.Microseconds(), 10)
		buf = append(buf, ' ')
		buf = strconv.AppendInt(buf, c.Rule.Capacity(), 10)
		ends = append(ends, len(buf))
	}
	all := string(buf)
	b.buf, b.ends = buf, ends

	keys, args := b.keys[:0], b.args[:0]
	start := 0
	for _, e := range ends {
		args = append(args, all[start:e])
		start = e
	}
	for _, c := range checks {
		keys = append(keys, c.Key)
	}
	b.keys, b.args = keys, args
}

func noCancel() {}

// deadline bounds ctx by the store's timeout. A ctx that already ends no
// later keeps its own deadline: no second timer (a measurable part of a
// Take's client-side cost when the caller sets one deadline per request).
func (s *Store) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= s.timeout {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, s.timeout)
}

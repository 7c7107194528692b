package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/redis/rueidis"
)

// How a Store runs its library (library.mode).
const (
	modeUnknown   int32 = iota // not loaded yet: the next call loads it
	modeFunctions              // loaded as a function library: FCALL
	modeScripts                // no functions here: EVALSHA, EVAL on NOSCRIPT
)

// loadRetry is how long a store whose FUNCTION LOAD failed for a reason
// that may pass (a timeout, a node down) runs the script before trying
// again.
const loadRetry = time.Second

// library is how a Store runs limit.lua: as a Redis Function where the
// server has them (FCALL: the library's functions are built once, when it
// loads), else as a script (EVALSHA). It is loaded on first use on every
// node the client knows (a Cluster's replicas refuse the write and get the
// library from their master), and again when a node answers that the
// function is missing (FUNCTION FLUSH, a node that joined since, Redis
// data loss). A call is sent again only after an answer saying it did not
// run (NOSCRIPT, or the function not found), never after a timeout.
type library struct {
	mode atomic.Int32
	// loads counts the loads done, so that calls that all met a missing
	// function at once load the library once.
	loads atomic.Uint64
	// next is when a failed load may be tried again (UnixNano).
	next atomic.Int64
	mu   sync.Mutex
}

// exec runs the library for b under the store's deadline and returns its
// reply.
func (s *Store) exec(parent context.Context, b *batch) ([]rueidis.RedisMessage, error) {
	ctx, cancel := s.deadline(parent)
	defer cancel()
	fn, gen := s.functions(ctx)
	r := s.retry(ctx, b, s.send(ctx, b, fn, false), fn, gen)
	s.observe(parent, b, r.Error())
	arr, err := r.ToArray()
	return arr, refused(err)
}

// refused wraps in limit.ErrStoreRefused an error reply that is about the
// call rather than the server's state (see unhealthy).
func refused(err error) error {
	if rerr, ok := rueidis.IsRedisErr(err); ok && !unhealthy(rerr) {
		return fmt.Errorf("%w: %w", limit.ErrStoreRefused, err)
	}
	return err
}

// unhealthy reports whether an error reply says the server cannot serve
// calls now, whatever they are: out of memory under noeviction, loading,
// a cluster or replica failover, a script busy, a failed background save.
// Those are the store's health, as a timeout is.
func unhealthy(rerr *rueidis.RedisError) bool {
	if cannotServe(rerr) {
		return true
	}
	msg := rerr.Error()
	for _, p := range []string{"OOM ", "MASTERDOWN ", "READONLY ", "BUSY ", "NOREPLICAS ", "MISCONF "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// retry sends b again (see send) while its reply r says it did not run,
// and returns the last reply:
//   - for want of the library (see retryable): at most FCALL after a load,
//     then EVALSHA, then EVAL (when flushes keep coming);
//   - because its slot is moving or the cluster is not serving (TRYAGAIN
//     while a slot is migrated and the call names keys missing on the node
//     it reached: a metered call's op marker always is, so it meets it for
//     the whole migration, see docs/reliability.md; CLUSTERDOWN, LOADING):
//     again after a short pause, until the store's deadline.
//
// Either way the call never ran, so sending it again cannot apply it twice
// (a call whose answer is lost is never resent).
func (s *Store) retry(ctx context.Context, b *batch, r rueidis.RedisResult, fn bool, gen uint64) rueidis.RedisResult {
	eval := false
	for loads := 0; ; {
		if notServing(r) {
			if !pause(ctx, notServingPause) {
				return r
			}
			r = s.send(ctx, b, fn, eval)
			continue
		}
		if loads == 3 {
			return r
		}
		again, asFn, asEval := s.retryable(ctx, r, fn, gen, loads)
		if !again {
			return r
		}
		loads++
		fn, eval = asFn, asEval
		r = s.send(ctx, b, fn, eval)
	}
}

// notServingPause is the wait before a call that met TRYAGAIN, CLUSTERDOWN
// or LOADING is sent again: a slot migration moves a key in well under a
// millisecond, a failover or a load takes longer, and the store's deadline
// bounds the whole.
const notServingPause = 2 * time.Millisecond

// notServing reports whether r says the server did not run the call because
// it cannot serve it now: TRYAGAIN (a multi-key call on a slot being
// migrated, naming keys the node does not hold), CLUSTERDOWN or LOADING.
func notServing(r rueidis.RedisResult) bool {
	rerr, ok := rueidis.IsRedisErr(r.Error())
	return ok && cannotServe(rerr)
}

// cannotServe reports whether an error reply is TRYAGAIN, CLUSTERDOWN or
// LOADING: the server did not run the call, for now.
func cannotServe(rerr *rueidis.RedisError) bool {
	return rerr.IsTryAgain() || rerr.IsClusterDown() || rerr.IsLoading()
}

// pause waits d, or less when ctx ends first; it reports whether ctx still
// has time for another try.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return ctx.Err() == nil
	}
}

// execMulti runs the library for every batch in one round trip (a pipeline,
// split by node in a Cluster) under the store's deadline, and returns each
// batch's reply and error.
func (s *Store) execMulti(parent context.Context, bs ...*batch) ([][]rueidis.RedisMessage, []error) {
	ctx, cancel := s.deadline(parent)
	defer cancel()
	fn, gen := s.functions(ctx)
	var res []rueidis.RedisResult
	if s.detours.view.Load() == nil {
		cmds := make(rueidis.Commands, len(bs))
		for i, b := range bs {
			cmds[i] = s.command(b, fn, false)
		}
		res = s.client.DoMulti(ctx, cmds...)
	} else {
		res = s.sendRouted(ctx, bs, fn)
	}
	arrs, errs := make([][]rueidis.RedisMessage, len(bs)), make([]error, len(bs))
	for i, r := range res {
		r = s.retry(ctx, bs[i], r, fn, gen)
		s.observe(parent, bs[i], r.Error())
		arrs[i], errs[i] = r.ToArray()
		errs[i] = refused(errs[i])
	}
	return arrs, errs
}

// sendRouted sends bs while some slot is watched, all at the same time: the
// batches that go through the client in one pipeline, each detoured one to
// its node.
func (s *Store) sendRouted(ctx context.Context, bs []*batch, fn bool) []rueidis.RedisResult {
	res := make([]rueidis.RedisResult, len(bs))
	var viaClient, detoured []int
	var cmds rueidis.Commands
	watched := false
	for i, b := range bs {
		if c, w := s.route(b); c == s.client {
			viaClient = append(viaClient, i)
			cmds = append(cmds, s.command(b, fn, false))
			watched = watched || w
		} else {
			detoured = append(detoured, i)
		}
	}
	var pipeline chan []rueidis.RedisResult
	if len(cmds) > 0 {
		pipeline = make(chan []rueidis.RedisResult, 1)
		go func() { pipeline <- s.doMulti(ctx, watched, cmds) }()
	}
	for _, i := range detoured {
		res[i] = s.send(ctx, bs[i], fn, false)
	}
	if pipeline != nil {
		for j, r := range <-pipeline {
			res[viaClient[j]] = r
		}
	}
	return res
}

// command is the call of the library for b: FCALL when fn, else EVALSHA,
// or EVAL when eval.
func (s *Store) command(b *batch, fn, eval bool) rueidis.Completed {
	n := int64(len(b.keys))
	switch {
	case fn:
		return s.client.B().Fcall().Function(functionName).Numkeys(n).Key(b.keys...).Arg(b.args...).Build()
	case eval:
		return s.client.B().Eval().Script(scriptSource).Numkeys(n).Key(b.keys...).Arg(b.args...).Build()
	}
	return s.client.B().Evalsha().Sha1(scriptSHA).Numkeys(n).Key(b.keys...).Arg(b.args...).Build()
}

// retryable reports whether the reply r of a call (sent as FCALL when fn,
// after gen loads) says the call did not run because the server lacks the
// library, and how to send it again: FCALL after loading the library once
// more (on the first attempt) or else EVALSHA; EVAL after NOSCRIPT.
func (s *Store) retryable(ctx context.Context, r rueidis.RedisResult, fn bool, gen uint64, attempt int) (again, asFn, eval bool) {
	rerr, ok := rueidis.IsRedisErr(r.Error())
	switch {
	case !ok:
		return false, false, false
	case rerr.IsNoScript():
		return true, false, true
	case fn && noFunction(rerr):
		if attempt == 0 && s.reload(ctx, gen) == nil {
			return true, true, false
		}
		return true, false, false
	}
	return false, false, false
}

// noFunction reports whether err says the function called is not loaded.
func noFunction(err *rueidis.RedisError) bool {
	return strings.Contains(err.Error(), "Function not found")
}

// functions reports whether calls go out as FCALL, loading the library on
// first use, and the number of loads done.
func (s *Store) functions(ctx context.Context) (bool, uint64) {
	switch s.lib.mode.Load() {
	case modeFunctions:
		return true, s.lib.loads.Load()
	case modeScripts:
		return false, 0
	}
	if time.Now().UnixNano() < s.lib.next.Load() {
		return false, 0
	}
	if err := s.reload(ctx, s.lib.loads.Load()); err != nil {
		return false, 0
	}
	return true, s.lib.loads.Load()
}

// Load loads the store's function library on every node the client knows,
// bounded by ctx rather than Options.Timeout. Calling it is optional: a
// store otherwise loads the library on its first call, within that call's
// Timeout, which a cold connection plus the library's compilation can
// exceed on a busy host (that call then fails, and the calls of the next
// loadRetry run the script, sent in full once per connection). It returns
// nil where calls run the script anyway (NoFunctions, or a server that
// refuses FUNCTION LOAD).
func (s *Store) Load(ctx context.Context) error {
	// reload answers errNoFunctions when calls run the script.
	if err := s.reload(ctx, s.lib.loads.Load()); err != nil && !errors.Is(err, errNoFunctions) {
		return fmt.Errorf("redisstore: loading the function library: %w", err)
	}
	return nil
}

// errNoFunctions means no node accepted the library as functions.
var errNoFunctions = errors.New("redisstore: the server refused FUNCTION LOAD")

// errLoadLater means a load failed less than loadRetry ago.
var errLoadLater = errors.New("redisstore: FUNCTION LOAD failed recently")

// reload loads the library on every node the client knows, unless a load
// was done since gen (another call met the same missing function). A node
// that refuses it as a replica (READONLY) is skipped: it gets the library
// from its master. When every other node refuses FUNCTION LOAD (Redis < 7,
// a user without the permission), the store runs the script from then on;
// any other failure (a timeout, a node down) is tried again after
// loadRetry, the calls in between running the script.
func (s *Store) reload(ctx context.Context, gen uint64) error {
	s.lib.mu.Lock()
	defer s.lib.mu.Unlock()
	if s.lib.loads.Load() != gen {
		return nil
	}
	if s.lib.mode.Load() == modeScripts {
		return errNoFunctions
	}
	if time.Now().UnixNano() < s.lib.next.Load() {
		return errLoadLater
	}
	loaded, refused := 0, 0
	var failed error
	for _, node := range s.client.Nodes() {
		err := node.Do(ctx, node.B().FunctionLoad().Replace().FunctionCode(functionSource).Build()).Error()
		rerr, isRedis := rueidis.IsRedisErr(err)
		switch {
		case err == nil:
			loaded++
		case isRedis && strings.HasPrefix(rerr.Error(), "READONLY"):
		case isRedis:
			refused++
			failed = err
		default:
			failed = err
		}
	}
	switch {
	case loaded > 0 && failed == nil:
		s.lib.loads.Add(1)
		s.lib.mode.Store(modeFunctions)
		return nil
	case refused > 0 && loaded == 0:
		s.lib.mode.Store(modeScripts)
		return errors.Join(errNoFunctions, failed)
	}
	s.lib.next.Store(time.Now().Add(loadRetry).UnixNano())
	if failed == nil {
		failed = errNoFunctions
	}
	return failed
}

package gateway

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
)

// minSweep bounds how often the tracker sweeps, whatever idle_timeout is.
const minSweep = 10 * time.Millisecond

// run sweeps every quarter of sessions.idle_timeout until ctx ends. Each
// sweep reads the timeout in force when it starts, not when its wait
// began: after a reload that raised it, the sweep the old, shorter period
// brings renews the leases of the old one (plan) before they run out.
func (t *sessionTracker) run(ctx context.Context) {
	for {
		timer := time.NewTimer(t.sweepEvery(t.idle()))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		t.sweep(ctx, t.idle())
	}
}

// idle is the sessions.idle_timeout in force, as a lease period.
func (t *sessionTracker) idle() time.Duration {
	return enforce.SessionPeriod(t.g.rt.Load().cfg.Sessions.IdleTimeout)
}

// sweepEvery is the period of the sweeps under idle: a quarter of it,
// and with a federation at most an eighth of its session timeout, so that
// touches come in time (touchEvery) whatever a reload made idle.
func (t *sessionTracker) sweepEvery(idle time.Duration) time.Duration {
	every := max(idle/4, minSweep)
	if fd := t.g.fed; fd != nil {
		every = min(every, fd.sessionTimeout/8)
	}
	return every
}

// sweepJob is one store or upstream call a sweep makes, outside the lock.
type sweepJob struct {
	e     *sessionEntry
	renew bool // renew the lease of a session in use
	end   bool // end an idle session
	touch bool // ping a session kept, in the federation (touchEvery)
	// copied under the lock
	upstream, tenant, subject, protocol string
	slots                               enforce.SessionSlots
	lastUse                             time.Time // the session's when plan picked it
}

// leaseEnd is when a lease taken or renewed at from runs out: a lease
// lasts the idle_timeout in force when it was taken.
func (t *sessionTracker) leaseEnd(from time.Time) time.Time {
	return from.Add(t.idle())
}

// sweep renews the leases of sessions used since the last sweep (so a slot
// never lapses while its session is in use: the lease lasts idle after the
// renewal, and the next sweep comes after idle/4), and those of a shorter
// idle_timeout than idle (a reload raised it), and then ends the sessions
// unused for idle, endParallel at a time: renewals never wait behind the
// DELETEs of a slow upstream. With a federation it also pings the sessions
// it keeps that were not pinged for touchEvery.
func (t *sessionTracker) sweep(ctx context.Context, idle time.Duration) {
	jobs := t.plan(idle)
	for _, j := range jobs {
		if ctx.Err() != nil {
			return
		}
		if j.renew {
			t.renew(ctx, j)
		}
	}
	sem := make(chan struct{}, endParallel)
	var wg sync.WaitGroup
	for _, j := range jobs {
		if !j.end && !j.touch || ctx.Err() != nil {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if j.end {
				t.endIdle(ctx, j)
			} else {
				t.touch(ctx, j)
			}
		})
	}
	wg.Wait()
}

// endParallel bounds the idle sessions a sweep ends at once.
const endParallel = 8

// plan picks the sweep's jobs. A session is idle when no request of it ran
// for idle and, when it holds a lease, this instance's last renewal is idle
// old too: its lease has then run out unless another instance renewed it.
// A lease that runs out before its session would be idle (one taken before
// a reload raised idle_timeout) is renewed even though the session is
// unused: else its slot would be free while the session lives on, and
// another session would take it over the caps. An idle session is ending
// from then on: tracked until the upstream has ended it or maxEndTries
// DELETEs did not (endIdle).
func (t *sessionTracker) plan(idle time.Duration) []sweepJob {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	var jobs []sweepJob
	for up, e := range t.m {
		j := sweepJob{e: e, upstream: up, tenant: e.tenant, subject: e.subject, protocol: e.protocol, slots: e.slots, lastUse: e.lastUse}
		switch {
		case e.ending:
			j.end = !now.Before(e.nextEnd) // a DELETE that did not end it, again
		case e.dead:
			if now.Sub(e.lastUse) >= idle {
				t.buryLocked(up, e.slots.Lease()) // its renewal found the lease gone
				t.dropLocked(up)                  // never asked for again
			}
		case e.active > 0 || e.usedSinceRenewal:
			e.usedSinceRenewal = false
			j.renew = e.slots.Held()
		case e.slots.Held() && now.Sub(e.lastUse) < idle && e.ownUntil.Before(e.lastUse.Add(idle)):
			j.renew = true
		case now.Sub(e.lastUse) >= idle && (!e.slots.Held() || now.Sub(e.renewed) >= idle && !now.Before(e.ownUntil)):
			// (a lease taken under a longer idle_timeout, before a reload,
			// is this instance's until ownUntil: kept tracked till then)
			// Tracked until the upstream has ended it (endIdle).
			e.ending, j.end = true, true
		}
		if !e.dead && !e.ending && t.g.fed != nil {
			// Kept: the federation must keep it too. A session first met
			// here started at most a sweep ago.
			if e.touched.IsZero() {
				e.touched = now
			}
			if now.Sub(e.touched) >= t.g.fed.touchEvery() {
				e.touched, j.touch = now, true
			}
		}
		if j.renew || j.end || j.touch {
			jobs = append(jobs, j)
		}
	}
	return jobs
}

// touchBody is the request that touches a session in the federation: a
// ping, which the federation answers itself, for a POST is what its
// session timer counts.
var touchBody = []byte(`{"jsonrpc":"2.0","id":"mcpgate-touch","method":"ping"}`)

// touch pings a session the gateway keeps in the federation, so that the
// federation's session timer, which counts POSTs only, does not end it
// while the client listens on its GET stream or while a reloaded, longer
// idle_timeout keeps it. A failure is retried touchEvery later: the
// timer's backstop is far longer.
func (t *sessionTracker) touch(ctx context.Context, j sweepJob) {
	ctx, cancel := context.WithTimeout(ctx, endTimeout)
	defer cancel()
	if err := t.g.sendUpstream(ctx, t.hc, http.MethodPost, j.tenant, j.subject, j.upstream, j.protocol, touchBody); err != nil {
		t.g.log.Warn("touching a session in the federation failed", "tenant", j.tenant, "err", err)
	}
}

// renew extends the lease of a session in use. A lease that is gone (a
// DELETE through another instance, an outage longer than idle) means the
// session no longer holds a slot: it is ended upstream and its next request
// gets 404.
func (t *sessionTracker) renew(ctx context.Context, j sweepJob) {
	rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	held, err := j.slots.Renew(rctx)
	cancel()
	t.mu.Lock()
	switch {
	case err != nil:
		j.e.usedSinceRenewal = true // again at the next sweep
	case held:
		j.e.renewed = t.now()
		j.e.ownUntil = t.leaseEnd(j.e.renewed)
	default:
		j.e.dead = true
		t.buryLocked(j.upstream, j.slots.Lease())
	}
	t.mu.Unlock()
	if err != nil {
		t.g.log.Warn("renewing a session's slot failed: retried at the next sweep", "tenant", j.tenant, "err", err)
		return
	}
	if !held {
		t.g.log.Info("session lost its slot: ending it upstream", "tenant", j.tenant, "subject", j.subject)
		t.endGone(ctx, j)
	}
}

// maxEndTries bounds the DELETEs the sweep sends to end one idle session:
// an upstream that keeps refusing them (MCP lets it: 405) or failing ends
// the session by its own timeout, and the tracker does not keep it for
// ever.
const maxEndTries = 4

// endIdle ends an idle session, unless its lease is still held: then
// another instance renewed it (the session is in use there, and that
// instance tracks it), and this one just forgets it. The check cannot
// extend the lease: a renewal never shortens one, and it asks for the
// shortest period. Its slots are freed, and the session forgotten, only
// once the upstream has ended it (2xx) or does not know it (404), as for
// a client's DELETE: a freed slot is a session gone upstream. Until then
// its next request here gets 404, and a DELETE that did not end it is sent
// again one idle_timeout later (endRefused). A session used since plan
// picked it (a request came in during the check) is no longer idle: it is
// kept (revived).
func (t *sessionTracker) endIdle(ctx context.Context, j sweepJob) {
	if j.slots.Held() {
		rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		held, err := j.slots.Check(rctx)
		cancel()
		switch {
		case err != nil:
			t.g.log.Warn("checking an idle session's slot failed: ending the session", "tenant", j.tenant, "err", err)
		case held:
			t.forgetUnlessRevived(j)
			return
		default:
			t.bury(j.upstream, j.slots.Lease())
		}
	}
	if !t.deadUnlessRevived(j) {
		return
	}
	gone, status := t.endGone(ctx, j)
	if !gone {
		t.endRefused(j, status)
		return
	}
	t.forget(j.e)
	rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	j.slots.Release(rctx)
	cancel()
	t.bury(j.upstream, j.slots.Lease())
}

// revivedLocked reports whether the idle session of j was used since plan
// picked it (a request came in during endIdle's check), and then stops
// ending it: it is no longer idle. use lets a request through until dead
// is set (not while ending: another instance may be renewing the session),
// and a request let through must not have its session DELETEd under it
// nor forgotten. A session already dead (a DELETE that did not end it,
// sent again) had no request since: they all got 404. A revived session
// whose lease is gone holds no slot: its next renewal finds so and ends it
// (renew).
func (t *sessionTracker) revivedLocked(j sweepJob) bool {
	e := j.e
	if e.dead || e.active == 0 && e.lastUse.Equal(j.lastUse) {
		return false
	}
	e.ending = false
	return true
}

// deadUnlessRevived marks the idle session of j dead, so that no request
// of it goes upstream any more, unless it was revived; it reports whether
// it did, in one step with the check: a request comes in either before,
// and the session is kept, or after, and gets 404.
func (t *sessionTracker) deadUnlessRevived(j sweepJob) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.revivedLocked(j) {
		return false
	}
	j.e.dead = true
	return true
}

// forgetUnlessRevived forgets the idle session of j, whose lease another
// instance holds, unless it was revived here: this instance serves it
// again, and renews it.
func (t *sessionTracker) forgetUnlessRevived(j sweepJob) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.revivedLocked(j) && t.m[j.upstream] == j.e {
		t.dropLocked(j.upstream)
	}
}

// endRefused schedules the next DELETE of an idle session the last one
// (answered status, 0 for none) did not end, or forgets it after
// maxEndTries. A version learnt from a request (learn) that the upstream
// refused (400) is dropped: the next DELETE goes without one, in the
// upstream's default version, rather than in a version it refuses every
// time.
func (t *sessionTracker) endRefused(j sweepJob, status int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := j.e
	if t.m[j.upstream] != e {
		return // forgotten meanwhile: a client's DELETE freed it
	}
	e.endTries++
	if e.endTries >= maxEndTries {
		t.dropLocked(j.upstream)
		t.g.log.Warn("an idle session was not ended upstream: forgotten, left to the upstream's own timeout",
			"tenant", j.tenant, "subject", j.subject, "tries", e.endTries)
		return
	}
	e.nextEnd = t.leaseEnd(t.now())
	if status == http.StatusBadRequest && !e.negotiated {
		e.protocol = ""
	}
}

// forget stops tracking e, unless it is no longer what the tracker holds
// for its session (a client's DELETE forgot it, a request tracked it anew).
func (t *sessionTracker) forget(e *sessionEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[e.upstream] == e {
		t.dropLocked(e.upstream)
	}
}

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

// run sweeps every quarter of sessions.idle_timeout (read again after each
// sweep, so a reload applies) until ctx ends.
func (t *sessionTracker) run(ctx context.Context) {
	for {
		idle := enforce.SessionPeriod(t.g.rt.Load().cfg.Sessions.IdleTimeout)
		timer := time.NewTimer(max(idle/4, minSweep))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		t.sweep(ctx, idle)
	}
}

// sweepJob is one store or upstream call a sweep makes, outside the lock.
type sweepJob struct {
	e     *sessionEntry
	renew bool // renew the lease of a session in use; else end an idle one
	// copied under the lock
	upstream, tenant, subject, protocol string
	slots                               enforce.SessionSlots
}

// leaseEnd is when a lease taken or renewed at from runs out: a lease
// lasts the idle_timeout in force when it was taken.
func (t *sessionTracker) leaseEnd(from time.Time) time.Time {
	return from.Add(enforce.SessionPeriod(t.g.rt.Load().cfg.Sessions.IdleTimeout))
}

// sweep renews the leases of sessions used since the last sweep (so a slot
// never lapses while its session is in use: the lease lasts idle after the
// renewal, and the next sweep comes after idle/4) and then ends the sessions
// unused for idle, endParallel at a time: renewals never wait behind the
// DELETEs of a slow upstream.
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
		if j.renew || ctx.Err() != nil {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t.endIdle(ctx, j)
		})
	}
	wg.Wait()
}

// endParallel bounds the idle sessions a sweep ends at once.
const endParallel = 8

// plan picks the sweep's jobs. A session is idle when no request of it ran
// for idle and, when it holds a lease, this instance's last renewal is idle
// old too: its lease has then run out unless another instance renewed it.
func (t *sessionTracker) plan(idle time.Duration) []sweepJob {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	var jobs []sweepJob
	for up, e := range t.m {
		j := sweepJob{e: e, upstream: up, tenant: e.tenant, subject: e.subject, protocol: e.protocol, slots: e.slots}
		switch {
		case e.dead:
			if now.Sub(e.lastUse) >= idle {
				t.dropLocked(up) // never asked for again
			}
		case e.active > 0 || e.usedSinceRenewal:
			e.usedSinceRenewal = false
			if e.slots.Held() {
				j.renew = true
				jobs = append(jobs, j)
			}
		case now.Sub(e.lastUse) >= idle && (!e.slots.Held() || now.Sub(e.renewed) >= idle && !now.Before(e.ownUntil)):
			// (a lease taken under a longer idle_timeout, before a reload,
			// is this instance's until ownUntil: kept tracked till then)
			t.dropLocked(up)
			jobs = append(jobs, j)
		}
	}
	return jobs
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
	}
	t.mu.Unlock()
	if err != nil {
		t.g.log.Warn("renewing a session's slot failed: retried at the next sweep", "tenant", j.tenant, "err", err)
		return
	}
	if !held {
		t.g.log.Info("session lost its slot: ending it upstream", "tenant", j.tenant, "subject", j.subject)
		t.endUpstream(ctx, j)
	}
}

// endIdle ends an idle session, unless its lease is still held: then
// another instance renewed it (the session is in use there, and that
// instance tracks it), and this one just forgets it. The check cannot
// extend the lease: a renewal never shortens one, and it asks for the
// shortest period.
func (t *sessionTracker) endIdle(ctx context.Context, j sweepJob) {
	if j.slots.Held() {
		rctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		held, err := j.slots.Check(rctx)
		cancel()
		if err != nil {
			t.g.log.Warn("checking an idle session's slot failed: ending the session", "tenant", j.tenant, "err", err)
		} else if held {
			return
		}
		rctx, cancel = context.WithTimeout(ctx, releaseTimeout)
		j.slots.Release(rctx)
		cancel()
	}
	t.endUpstream(ctx, j)
}

// endUpstream sends the upstream the DELETE that ends a session, with the
// configured upstream and identity headers.
func (t *sessionTracker) endUpstream(ctx context.Context, j sweepJob) {
	ctx, cancel := context.WithTimeout(ctx, endTimeout)
	defer cancel()
	err := t.g.sendUpstream(ctx, t.hc, http.MethodDelete, j.tenant, j.subject, j.upstream, j.protocol, nil)
	if err != nil {
		t.g.log.Warn("ending an idle session upstream failed", "err", err)
		return
	}
	t.g.metrics.SessionsEnded.Inc()
}

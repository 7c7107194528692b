package enforce

import (
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// The local fallback (on_error: local) decides a call's monthly quota on
// what this instance knows of its meter: the usage the shared store last
// reported for it, plus this instance's usage not on it yet (pending, or
// being placed). Other instances' usage since that report is unknown, so
// a quota may still be passed by what they admit meanwhile; this
// instance's own calls cannot pass it. A meter this instance never heard
// the store report on (a restart during the outage, a tenant new to it)
// has no quota under the fallback.

// saw records u, the usage the shared store reported for meter's key.
// Only meters with a quota are recorded, and a report on a meter without
// (a placement's, whose meter carries none) only updates a record there
// is. The record lapses at the end of its period. An older answer
// arriving late does not replace a newer one: a meter's usage only grows
// within a generation.
func (m *meterer) saw(meter limit.Meter, u limit.Usage) {
	if m == nil {
		return
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	old, ok := m.reported.get(meter.Key, now)
	switch {
	case !ok && meter.Quota <= 0:
		return
	case ok && (u.Charged < old.Charged || u.Charged == old.Charged && u.Refunded < old.Refunded):
		return
	}
	end, err := usage.PeriodEnd(meter.Period)
	if err != nil || !now.Before(end) {
		return
	}
	m.reported.set(meter.Key, meter.Tenant, u, now, end)
}

// known returns what this instance knows of key's usage: the store's last
// report (ok false without one) plus the usage of this instance not on it
// yet: pending, or taken out of pending by a placement not yet resolved.
// An op whose answer was lost counts though it may have landed (and the
// report show it): the quota is then met early, never passed.
func (m *meterer) known(key string) (limit.Usage, bool) {
	if m == nil {
		return limit.Usage{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	u, ok := m.reported.get(key, time.Now())
	if !ok {
		return limit.Usage{}, false
	}
	if p := m.pending[key]; p != nil {
		u = add(u, p.total())
	}
	return add(u, m.placing[key]), true
}

// total is all the usage p holds: its delta and its ops'.
func (p *pendingUsage) total() limit.Usage {
	u := p.delta
	for _, op := range p.ops {
		u = add(u, op.delta)
	}
	return u
}

// placed takes delta, resolved (placed, pending again or dropped), out of
// key's usage being placed.
func (m *meterer) placed(key string, delta limit.Usage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	left := sub(m.placing[key], delta)
	if left == (limit.Usage{}) {
		delete(m.placing, key)
		return
	}
	m.placing[key] = left
}

// quotaUsedUp reports whether, as far as this instance knows (see known),
// meter's quota cannot take a call of cost, and the usage it knows: the
// local fallback then refuses the call as the store would.
func (l *limiter) quotaUsedUp(meter *limit.Meter, cost int64) (limit.Usage, bool) {
	if meter == nil || meter.Quota <= 0 || l.meters == nil {
		return limit.Usage{}, false
	}
	u, ok := l.meters.known(meter.Key)
	return u, ok && u.Used()+meter.CostFor(cost) > meter.Quota
}

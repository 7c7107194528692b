package limit

// CombineRequest builds the decisions of a Request with global checks, as
// every store must, from the results of its tenant checks followed by those
// of its global checks (len(req.Checks)+len(req.Global) results), the lease
// (when a concurrency slot was taken) and whether the meter admitted the
// call (ignored without a meter). It returns Outcome.Decision,
// Outcome.Global and Outcome.GlobalDecides (see Outcome):
//
//   - d is Combine over the tenant checks followed by the global checks,
//     with d.Results the tenant checks' results only; when every enforced
//     check admitted but the meter did not, d is denied with the zero Rule,
//     as CombineMetered's;
//   - g is Combine over the global checks alone, without a lease (d.Lease
//     names every slot of the request);
//   - globalDecides reports that d's rule is a global check's.
//
// Without global checks it is the decision of a request without them
// (CombineMetered with a meter, Combine without), g is zero and
// globalDecides false.
func CombineRequest(req Request, results []Result, lease string, meterOK bool) (d, g Decision, globalDecides bool) {
	n := len(req.Checks)
	tenant := results[:n:n]
	if len(req.Global) == 0 {
		switch {
		case req.Meter != nil:
			return CombineMetered(req.Checks, tenant, lease, meterOK), g, false
		case n == 0:
			return Decision{Allowed: true, Results: tenant}, g, false
		}
		return Combine(req.Checks, tenant, lease), g, false
	}
	all := make([]Check, 0, n+len(req.Global))
	all = append(append(all, req.Checks...), req.Global...)
	d, best := combine(all, results, lease)
	d.Results = tenant
	g, _ = combine(req.Global, results[n:], "")
	if req.Meter != nil && !meterOK && d.Allowed {
		return Decision{Results: tenant}, g, false
	}
	return d, g, best >= n
}

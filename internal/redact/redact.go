// Package redact keeps credentials that configured URLs carry out of
// errors that end up in logs, traces and answers.
//
// Operators put secrets in URLs: an upstream's API key in its query, a
// webhook's token in its path (Slack, Teams), a password in its userinfo.
// net/http hides only the password when it reports a failed request, and
// such an error reaches mcpgate's log, its spans, and (through the
// federation's refusals) its clients on every failure.
package redact

import (
	"cmp"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// URLError returns err with the URL of the *url.Error in its chain (what
// an http.Client returns, which the MCP SDK wraps) cut to scheme://host
// (Origin). When err is that *url.Error, the result is a copy with its Op
// and cause kept; when it wraps one, the result's text is err's with the
// URL replaced, and it unwraps to err, so errors.Is sees through it as
// before. An error without a *url.Error, nil included, is returned as is.
func URLError(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	safe := &url.Error{Op: ue.Op, URL: Origin(ue.URL), Err: ue.Err}
	if err == error(ue) {
		return safe
	}
	return Replace(err, []string{strconv.Quote(ue.URL), ue.URL}, strconv.Quote(safe.URL))
}

// Replace returns err with every one of forms in its text replaced by
// safe; the result unwraps to err, so errors.Is sees through it. When
// none occurs, or err is nil, err is returned as is. Forms that contain
// one another go longest first (as Forms orders them), or the shorter
// would leave the rest of the longer behind.
func Replace(err error, forms []string, safe string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	out := msg
	for _, f := range forms {
		out = strings.ReplaceAll(out, f, safe)
	}
	if out == msg {
		return err
	}
	return &wrapped{msg: out, err: err}
}

// Forms returns the ways an error may write raw, parsed as u, longest
// first: as given, as net/url writes it back, with the password hidden as
// net/url's Redacted does and as an http.Client's *url.Error does, each also
// as %q escapes it. All but one (no userinfo, no query) hold a credential
// the URL may carry: a password, a key in the query or in the user name.
func Forms(raw string, u *url.URL) []string {
	forms := []string{raw, u.String(), u.Redacted()}
	if _, ok := u.User.Password(); ok {
		forms = append(forms, strings.Replace(u.String(), u.User.String()+"@", u.User.Username()+":***@", 1))
	}
	for _, f := range forms {
		if q := strconv.Quote(f); q[1:len(q)-1] != f {
			forms = append(forms, q[1:len(q)-1])
		}
	}
	slices.SortFunc(forms, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	return slices.Compact(forms)
}

// wrapped is an error whose text had a URL cut; it unwraps to the original.
type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }

// Origin is raw cut to scheme://host: no userinfo, path, query or
// fragment. It is "" when raw does not parse as a URL with a host.
func Origin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// Package redact keeps credentials that configured URLs carry out of
// errors that end up in logs, traces and answers.
//
// Operators put secrets in URLs: an upstream's API key in its query, a
// webhook's token in its path (Slack, Teams), a password in its userinfo.
// net/http hides only the password when it reports a failed request, and
// such an error reaches mcpgate's log and its spans on every failure.
package redact

import "net/url"

// URLError returns err, when it is a *url.Error (what an http.Client
// returns), as a copy whose URL is cut to scheme://host (Origin): its Op
// and its cause are kept, so errors.Is and errors.As see through it as
// before. Any other error, nil included, is returned as is.
func URLError(err error) error {
	ue, ok := err.(*url.Error)
	if !ok {
		return err
	}
	return &url.Error{Op: ue.Op, URL: Origin(ue.URL), Err: ue.Err}
}

// Origin is raw cut to scheme://host: no userinfo, path, query or
// fragment. It is "" when raw does not parse as a URL with a host.
func Origin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strings"

	"github.com/mcpgate/mcpgate/auth"
)

// sessionBinder binds MCP session ids to the caller that opened them. The
// upstream's id reaches the client as "<id>.<mac>" (or "<id>.<lease>.<mac>"
// when the session holds a slot, see wrapLease), the mac an HMAC of the
// caller's tenant, subject and the id; a request whose session id was not
// issued to its caller is refused before it reaches the upstream. Without
// it, anyone who learned another tenant's session id could act inside that
// session, since the upstream only sees the gateway. Binding is stateless:
// every instance sharing the key accepts the ids of the others.
type sessionBinder struct {
	key []byte
}

// sessionMACLen is the length of the encoded mac: 22 base64 characters carry
// 132 bits, more than enough against forgery.
const sessionMACLen = 22

// newSessionBinder uses key, or a random key when it is empty (then ids stay
// valid only on this instance, and across a restart not at all).
func newSessionBinder(key []byte) *sessionBinder {
	if len(key) == 0 {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			panic(err) // crypto/rand never fails on supported platforms
		}
	}
	return &sessionBinder{key: key}
}

// DeriveSessionKey derives the session-binding key from another secret (the
// HS256 secret all instances already share), for a distinct purpose.
func DeriveSessionKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("mcpgate session binding v1"))
	return m.Sum(nil)
}

func (b *sessionBinder) mac(p auth.Principal, id string) string {
	m := hmac.New(sha256.New, b.key)
	m.Write([]byte(p.Tenant))
	m.Write([]byte{0})
	m.Write([]byte(p.Subject))
	m.Write([]byte{0})
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))[:sessionMACLen]
}

// wrap turns the upstream's session id into the one the caller sees.
func (b *sessionBinder) wrap(p auth.Principal, upstream string) string {
	return upstream + "." + b.mac(p, upstream)
}

// answer returns how the session id of the upstream's answer to a request
// of p becomes the one the client sees (relay.session). sent is the
// client's id the request carried and upstream the id it unwraps to, both
// "" when it carried none. The upstream repeating that session (as the
// TypeScript SDK's server does on its event streams) gives the client back
// its id as sent: wrapping it again would drop its lease, and a client that
// adopts each id it is given would then carry none, so no other instance
// could renew or free its slot. Any other id is a session the request did
// not open through an admitted initialize and that holds no slot: it gets
// wrap's form, without a lease (the request's lease is the slot of the
// session it named, not of this one).
func (b *sessionBinder) answer(p auth.Principal, sent, upstream string) func(string) string {
	return func(id string) string {
		if sent != "" && id == upstream {
			return sent
		}
		return b.wrap(p, id)
	}
}

// wrapLease is wrap for a session holding a slot under lease (see
// sessions.go): "<id>.<lease>.<mac>", the mac covering the lease too, so any
// instance can renew and release the slot and no caller can name another
// lease. lease must not contain '.' (the stores' leases never do); an empty
// lease gives wrap's form.
func (b *sessionBinder) wrapLease(p auth.Principal, upstream, lease string) string {
	if lease == "" || strings.IndexByte(lease, '.') >= 0 {
		return b.wrap(p, upstream)
	}
	return upstream + "." + lease + "." + b.leaseMAC(p, upstream, lease)
}

// leaseMAC is the mac of the lease form. Its input starts with a label and
// frames every field with its length, so it never equals the input of mac
// for any id: an id of one form cannot be passed off as the other.
func (b *sessionBinder) leaseMAC(p auth.Principal, id, lease string) string {
	m := hmac.New(sha256.New, b.key)
	m.Write([]byte("mcpgate session lease v2"))
	for _, f := range []string{p.Tenant, p.Subject, id, lease} {
		m.Write(binary.BigEndian.AppendUint64(nil, uint64(len(f))))
		m.Write([]byte(f))
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))[:sessionMACLen]
}

// unwrap returns the upstream session id of a client's id and the lease of
// its slot ("" for ids of wrap's form, issued without one or before slots
// existed, which stay valid), or false when the id was not issued to p
// (forged, another caller's, or from another key).
func (b *sessionBinder) unwrap(p auth.Principal, client string) (upstream, lease string, ok bool) {
	i := strings.LastIndexByte(client, '.')
	if i < 0 || len(client)-i-1 != sessionMACLen {
		return "", "", false
	}
	body, mac := client[:i], []byte(client[i+1:])
	if hmac.Equal(mac, []byte(b.mac(p, body))) {
		return body, "", true
	}
	j := strings.LastIndexByte(body, '.')
	if j < 0 {
		return "", "", false
	}
	id, lease := body[:j], body[j+1:]
	if lease == "" || !hmac.Equal(mac, []byte(b.leaseMAC(p, id, lease))) {
		return "", "", false
	}
	return id, lease, true
}

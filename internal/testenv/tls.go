package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// testPKI is a throwaway CA and a server certificate it signed, written as PEM
// files for redis-server.
type testPKI struct {
	pool                      *x509.CertPool // trusts the CA only
	caFile, certFile, keyFile string
}

// newTestPKI generates an ECDSA P-256 CA and a server certificate valid for
// 127.0.0.1, ::1 and localhost, and writes ca.crt, server.crt and server.key
// into dir.
func newTestPKI(dir string) (*testPKI, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("testenv: CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "mcpgate testenv CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("testenv: CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("testenv: CA certificate: %w", err)
	}

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("testenv: server key: %w", err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// ClientAuth too: redis uses the same certificate for outgoing
		// connections (replication, cluster bus) when those run over TLS.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("testenv: server certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return nil, fmt.Errorf("testenv: server key: %w", err)
	}

	p := &testPKI{
		pool:     x509.NewCertPool(),
		caFile:   filepath.Join(dir, "ca.crt"),
		certFile: filepath.Join(dir, "server.crt"),
		keyFile:  filepath.Join(dir, "server.key"),
	}
	p.pool.AddCert(caCert)
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{
		{p.caFile, "CERTIFICATE", caDER},
		{p.certFile, "CERTIFICATE", srvDER},
		{p.keyFile, "PRIVATE KEY", keyDER},
	} {
		data := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := os.WriteFile(f.path, data, 0o600); err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	return p, nil
}

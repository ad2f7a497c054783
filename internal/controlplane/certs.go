package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// Files of the state dir that the apiserver reads.
const (
	caCertFile      = "ca.crt"
	servingCertFile = "apiserver.crt"
	servingKeyFile  = "apiserver.key"
	saKeyFile       = "sa.key"
	saPubFile       = "sa.pub"
	tokensFile      = "tokens.csv"
	kubeconfigFile  = "kubeconfig"
)

// Admin is the user of the static token every client gets: in
// system:masters, so RBAC lets it do anything, as a cluster admin.
const Admin = "admin"

// nodeUser is the user name the Node authorizer gives a kubelet's rights to.
func nodeUser(node string) string { return "system:node:" + node }

// credentials are what the state dir holds for TLS and authentication.
type credentials struct {
	caPEM []byte
	token string
}

// writeCredentials creates, with Go's crypto only, a CA and the serving
// certificate it signs (so clients verify the apiserver instead of skipping
// TLS checks), the service-account signing key pair, and the static token
// file.
func writeCredentials(dir string, addr netip.Addr, nodes []string) (credentials, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return credentials{}, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "sluice-lab-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return credentials{}, fmt.Errorf("create CA certificate: %w", err)
	}
	ca, err = x509.ParseCertificate(caDER)
	if err != nil {
		return credentials{}, fmt.Errorf("parse CA certificate: %w", err)
	}

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return credentials{}, fmt.Errorf("generate serving key: %w", err)
	}
	ips := []net.IP{net.IP(addr.AsSlice()), net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, p := range ServiceCIDRs {
		// The first address of each range is the "kubernetes" Service.
		ips = append(ips, net.IP(p.Addr().Next().AsSlice()))
	}
	srv := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: ips,
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return credentials{}, fmt.Errorf("create serving certificate: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return credentials{}, fmt.Errorf("generate service-account key: %w", err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return credentials{}, fmt.Errorf("encode service-account public key: %w", err)
	}

	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return credentials{}, fmt.Errorf("generate token: %w", err)
	}
	token := hex.EncodeToString(tok)
	// token,user,uid,"group"
	tokens := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", token, Admin, Admin)
	for _, n := range nodes {
		if _, err := rand.Read(tok); err != nil {
			return credentials{}, fmt.Errorf("generate token: %w", err)
		}
		tokens += fmt.Sprintf("%s,%s,%s,\"system:nodes\"\n", hex.EncodeToString(tok), nodeUser(n), nodeUser(n))
	}

	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	srvKeyPEM, err := ecKeyPEM(srvKey)
	if err != nil {
		return credentials{}, err
	}
	saKeyPEM, err := ecKeyPEM(saKey)
	if err != nil {
		return credentials{}, err
	}
	files := []struct {
		name string
		data []byte
	}{
		{caCertFile, caPEM},
		{servingCertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER})},
		{servingKeyFile, srvKeyPEM},
		{saKeyFile, saKeyPEM},
		{saPubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub})},
		{tokensFile, []byte(tokens)},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return credentials{}, fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	return credentials{caPEM: caPEM, token: token}, nil
}

func ecKeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode P-256 key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

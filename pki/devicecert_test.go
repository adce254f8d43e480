package pki

import (
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestDeviceCertificatesChainToTheDevIDCAAndCarryTheDeclaration(t *testing.T) {
	a, _ := newAuthority(t, "")
	ak := []byte{0x00, 0x0b, 1, 2, 3}
	for _, kind := range []DeviceKind{LDevID, LAK} {
		key := mustKey(t)
		c, err := a.DevIDIssuer.IssueDevice(DeviceRequest{
			Kind: kind, PublicKey: key.Public(), Device: "web-01", Serial: "SN-123",
			ProductUUID: "4C4C4544-0042-3510-8052-B4C04F4E3132", TPMAKName: ak,
			NotBefore: testNow, NotAfter: testNow.Add(2 * time.Hour),
		})
		if err != nil {
			t.Fatalf("IssueDevice(%s): %v", kind, err)
		}
		devid := x509.NewCertPool()
		devid.AddCert(a.DevIDCA)
		roots := x509.NewCertPool()
		roots.AddCert(a.Root)
		opts := x509.VerifyOptions{Roots: roots, Intermediates: devid, CurrentTime: testNow.Add(time.Hour), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
		chains, err := c.Verify(opts)
		if err != nil {
			t.Fatalf("%s does not verify to the root through the DevID CA: %v", kind, err)
		}
		if !chains[0][1].Equal(a.DevIDCA) {
			t.Errorf("%s chains through %s, want the DevID CA", kind, chains[0][1].Subject)
		}
		nodeCA := x509.NewCertPool()
		nodeCA.AddCert(a.NodeCA)
		if _, err := c.Verify(x509.VerifyOptions{Roots: nodeCA, CurrentTime: opts.CurrentTime, KeyUsages: opts.KeyUsages}); err == nil {
			t.Errorf("%s verifies under the node CA", kind)
		}
		if len(c.URIs) != 1 || c.URIs[0].String() != "urn:uuid:4c4c4544-0042-3510-8052-b4c04f4e3132" {
			t.Errorf("%s URIs = %v, want only the product UUID's URN (no SPIFFE ID)", kind, c.URIs)
		}
		info, err := ParseDeviceCert(c)
		if err != nil {
			t.Fatal(err)
		}
		if info.Kind != kind || info.Device != "web-01" || info.Serial != "SN-123" || string(info.TPMAKName) != string(ak) ||
			info.ProductUUID != "4c4c4544-0042-3510-8052-b4c04f4e3132" {
			t.Errorf("ParseDeviceCert = %+v", info)
		}
		if _, err := ParseNodeCert(c); err == nil {
			t.Errorf("ParseNodeCert accepts the %s as a node certificate", kind)
		}
		clientAuth := len(c.ExtKeyUsage) == 1 && c.ExtKeyUsage[0] == x509.ExtKeyUsageClientAuth
		if clientAuth != (kind == LDevID) {
			t.Errorf("%s extended key usages %v", kind, c.ExtKeyUsage)
		}
	}
}

func TestDeviceRequestsOutsideTheRulesAreRefused(t *testing.T) {
	a, _ := newAuthority(t, "")
	good := DeviceRequest{Kind: LDevID, PublicKey: mustKey(t).Public(), Device: "web-01", TPMAKName: []byte{0, 0xb, 1},
		NotBefore: testNow, NotAfter: testNow.Add(time.Hour)}
	for name, tc := range map[string]struct {
		edit func(*DeviceRequest)
		want string
	}{
		"no kind":           {func(r *DeviceRequest) { r.Kind = "" }, "kind"},
		"bad device name":   {func(r *DeviceRequest) { r.Device = "Web 01" }, "device name"},
		"bad uuid":          {func(r *DeviceRequest) { r.ProductUUID = "not-a-uuid" }, "not a UUID"},
		"control in serial": {func(r *DeviceRequest) { r.Serial = "a\nb" }, "control character"},
		"no AK name":        {func(r *DeviceRequest) { r.TPMAKName = nil }, "no TPM AK name"},
		"empty validity":    {func(r *DeviceRequest) { r.NotAfter = r.NotBefore }, "empty"},
	} {
		r := good
		tc.edit(&r)
		if _, err := a.DevIDIssuer.IssueDevice(r); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: IssueDevice error %v, want one containing %q", name, err, tc.want)
		}
	}
	if _, err := a.DevIDIssuer.IssueDevice(good); err != nil {
		t.Fatalf("the good request: %v", err)
	}
}

func TestAddDevIDCAToAnOlderDirectory(t *testing.T) {
	a, dir := newAuthority(t, "")
	if err := AddDevIDCA(dir, time.Now()); !errors.Is(err, ErrExists) {
		t.Fatalf("AddDevIDCA on a directory with a DevID CA: %v, want ErrExists", err)
	}
	for _, f := range []string{DevIDCACertFile, DevIDCAKeyFile} {
		if err := os.Remove(Path(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadAuthority(dir); err == nil || !strings.Contains(err.Error(), "fleetd init --add-devid-ca") {
		t.Fatalf("LoadAuthority without a DevID CA: %v, want the way to add it", err)
	}
	if err := AddDevIDCA(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	b, err := LoadAuthority(dir)
	if err != nil || b.DevIDCA.Equal(a.DevIDCA) || b.DevIDIssuer == nil {
		t.Fatalf("after AddDevIDCA: %v", err)
	}
	if err := b.DevIDCA.CheckSignatureFrom(b.Root); err != nil {
		t.Errorf("the added DevID CA is not signed by the root: %v", err)
	}
	if b.DevIDCA.Equal(b.NodeCA) || b.DevIDCA.Subject.CommonName == b.NodeCA.Subject.CommonName {
		t.Errorf("the DevID CA %q is the node CA's", b.DevIDCA.Subject.CommonName)
	}
	if st, err := os.Stat(Path(dir, DevIDCAKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("devid-ca.key: %v %v", st.Mode(), err)
	}
}

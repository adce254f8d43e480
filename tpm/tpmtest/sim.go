package tpmtest

import (
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmsim"
)

// OpenSim manufactures a fresh simulated TPM (new seeds, empty NV, PCRs at
// their initial values) and returns it with its raw transport, for the
// commands a test sends itself. The simulator is one per process; it is
// released when the test ends. It needs the tpmsim build tag: without it
// the test fails, naming the tag.
func OpenSim(t testing.TB) (*tpm.TPM, transport.TPM) {
	t.Helper()
	tr, err := tpmsim.OpenTransport()
	if err != nil {
		t.Fatal(err)
	}
	tp := tpm.New(tr, tr)
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Errorf("close the simulator: %v", err)
		}
	})
	return tp, tr
}

// WriteNV plays the TPM's manufacturer: it defines idx with platform
// authorization and the attributes a manufacturer gives an EK certificate
// index, of size bytes (len(data) when size is 0), and writes data to it,
// zero-padded.
func WriteNV(t testing.TB, tr transport.TPM, idx uint32, data []byte, size int) {
	t.Helper()
	if size == 0 {
		size = len(data)
	}
	platform := tpm2.AuthHandle{Handle: tpm2.TPMRHPlatform, Auth: tpm2.PasswordAuth(nil)}
	if _, err := (tpm2.NVDefineSpace{
		AuthHandle: platform,
		PublicInfo: tpm2.New2B(tpm2.TPMSNVPublic{
			NVIndex: tpm2.TPMHandle(idx),
			NameAlg: tpm2.TPMAlgSHA256,
			Attributes: tpm2.TPMANV{
				PPWrite: true, WriteDefine: true, PPRead: true, OwnerRead: true,
				AuthRead: true, NoDA: true, PlatformCreate: true, NT: tpm2.TPMNTOrdinary,
			},
			DataSize: uint16(size),
		}),
	}).Execute(tr); err != nil {
		t.Fatalf("TPM2_NV_DefineSpace %#x: %v", idx, err)
	}
	rp, err := tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(idx)}.Execute(tr)
	if err != nil {
		t.Fatal(err)
	}
	padded := make([]byte, size)
	copy(padded, data)
	for off := 0; off < size; off += 512 {
		end := min(off+512, size)
		if _, err := (tpm2.NVWrite{
			AuthHandle: platform,
			NVIndex:    tpm2.NamedHandle{Handle: tpm2.TPMHandle(idx), Name: rp.NVName},
			Data:       tpm2.TPM2BMaxNVBuffer{Buffer: padded[off:end]},
			Offset:     uint16(off),
		}).Execute(tr); err != nil {
			t.Fatalf("TPM2_NV_Write %#x at %d: %v", idx, off, err)
		}
	}
}

// UndefineNV removes idx, an index defined with platform authorization
// (as [WriteNV] and swtpm_setup define EK certificate indices), as a
// manufacturer that ships no such certificate would have left it.
func UndefineNV(t testing.TB, tr transport.TPM, idx uint32) {
	t.Helper()
	rp, err := tpm2.NVReadPublic{NVIndex: tpm2.TPMHandle(idx)}.Execute(tr)
	if err != nil {
		t.Fatalf("TPM2_NV_ReadPublic %#x: %v", idx, err)
	}
	if _, err := (tpm2.NVUndefineSpace{
		AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHPlatform, Auth: tpm2.PasswordAuth(nil)},
		NVIndex:    tpm2.NamedHandle{Handle: tpm2.TPMHandle(idx), Name: rp.NVName},
	}).Execute(tr); err != nil {
		t.Fatalf("TPM2_NV_UndefineSpace %#x: %v", idx, err)
	}
}

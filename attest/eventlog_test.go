package attest_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/attest"
)

func TestReplayEventLogEmpty(t *testing.T) {
	t.Run("a fresh TPM without a log", func(t *testing.T) {
		for _, log := range [][]byte{nil, {}} {
			got, err := attest.ReplayEventLog(log, zeroPCRs())
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Events) != 0 || got.SecureBoot != nil {
				t.Fatalf("an empty log gave %d events, Secure Boot %v", len(got.Events), got.SecureBoot)
			}
		}
	})
	t.Run("a measured PCR without a log", func(t *testing.T) {
		pcrs := zeroPCRs()
		pcrs[4][0] = 1
		_, err := attest.ReplayEventLog(nil, pcrs)
		requireEventLogError(t, err, "PCR 4 has no event")
	})
}

func TestReplayEventLogAccepts(t *testing.T) {
	events := sampleEvents()
	got, err := attest.ReplayEventLog(buildEventLog(events), replayLog(events))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Events) != len(events) {
		t.Fatalf("%d events verified, want %d", len(got.Events), len(events))
	}
	for i, e := range got.Events {
		if e.Index != events[i].pcr || !bytes.Equal(e.Digest, events[i].digestOf()) || !bytes.Equal(e.Data, events[i].data) {
			t.Fatalf("event %d: PCR %d digest %x, want PCR %d digest %x", i, e.Index, e.Digest, events[i].pcr, events[i].digestOf())
		}
	}
	// PCR 7 has a separator and no Secure Boot variable: the state is
	// known, and off.
	if got.SecureBoot == nil || got.SecureBoot.Enabled {
		t.Fatalf("Secure Boot %+v, want a state with Enabled false", got.SecureBoot)
	}

	t.Run("PCR 7 not measured: Secure Boot unknown", func(t *testing.T) {
		ev := events[:2]
		got, err := attest.ReplayEventLog(buildEventLog(ev), replayLog(ev))
		if err != nil {
			t.Fatal(err)
		}
		if got.SecureBoot != nil {
			t.Fatalf("Secure Boot %+v from a log without PCR 7 events", got.SecureBoot)
		}
	})
	t.Run("a subset of the PCRs", func(t *testing.T) {
		all := replayLog(events)
		got, err := attest.ReplayEventLog(buildEventLog(events), map[int][]byte{4: all[4]})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Events) != 2 || got.SecureBoot != nil {
			t.Fatalf("%d events and Secure Boot %v for PCR 4 alone", len(got.Events), got.SecureBoot)
		}
	})
	t.Run("a startup locality", func(t *testing.T) {
		// TPM2_Startup from locality 3: PCR 0 starts at 00…03.
		locality := logEvent{pcr: 0, typ: evNoAction, data: []byte("StartupLocality\x00\x03")}
		ev := []logEvent{locality, {pcr: 7, typ: evSeparator, data: []byte{0, 0, 0, 0}}}
		pcrs := replayLog(ev)
		pcrs[0][31] = 3
		if _, err := attest.ReplayEventLog(buildEventLog(ev), pcrs); err != nil {
			t.Fatal(err)
		}
		pcrs[0][31] = 0
		_, err := attest.ReplayEventLog(buildEventLog(ev), pcrs)
		requireEventLogError(t, err, "PCR 0 has no event")
	})
}

func TestReplayEventLogRealLogs(t *testing.T) {
	for _, tc := range []struct {
		file       string
		secureBoot bool
	}{
		{"ubuntu_2104_shielded_vm_no_secure_boot_eventlog", false},
		{"sb_cert_eventlog", true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			log, pcrs := readTestLog(t, tc.file)
			got, err := attest.ReplayEventLog(log, pcrs)
			if err != nil {
				t.Fatal(err)
			}
			if got.SecureBoot == nil || got.SecureBoot.Enabled != tc.secureBoot {
				t.Fatalf("Secure Boot %+v, want Enabled %v", got.SecureBoot, tc.secureBoot)
			}
			if tc.secureBoot && len(got.SecureBoot.PostSeparatorAuthority) == 0 {
				t.Fatal("Secure Boot on without an authority after the separator")
			}
			for i := range 8 {
				bad := cloneMap(pcrs)
				bad[i][5] ^= 0x40
				if _, err := attest.ReplayEventLog(log, bad); !errors.Is(err, attest.ErrEventLog) {
					t.Errorf("PCR %d changed: %v, want ErrEventLog", i, err)
				}
			}
			if _, err := attest.ReplayEventLog(log[:len(log)-7], pcrs); !errors.Is(err, attest.ErrEventLog) {
				t.Errorf("truncated log: %v, want ErrEventLog", err)
			}
		})
	}
	t.Run("a PCR the log does not measure must read its initial value", func(t *testing.T) {
		// sb_cert_eventlog measures PCRs 0, 4, 5 and 7 only: go-attestation
		// alone accepts any value of PCR 1.
		log, pcrs := readTestLog(t, "sb_cert_eventlog")
		pcrs[1] = bytes.Repeat([]byte{0x11}, 32)
		_, err := attest.ReplayEventLog(log, pcrs)
		requireEventLogError(t, err, "PCR 1 has no event")
	})
}

func TestReplayEventLogRefuses(t *testing.T) {
	events := sampleEvents()
	log := buildEventLog(events)
	pcrs := replayLog(events)
	with := func(f func(m map[int][]byte)) map[int][]byte {
		m := cloneMap(pcrs)
		f(m)
		return m
	}
	dropped := buildEventLog(events[:len(events)-1])
	extra := buildEventLog(append(append([]logEvent{}, events...), logEvent{pcr: 4, typ: evEFIBootServicesApp, data: []byte("more")}))
	badSB := append(append([]logEvent{}, events...), logEvent{pcr: 7, typ: evSCRTMVersion, data: []byte("x")})
	sha1Only := func() []byte {
		// A TPM 1.2 style log: SHA-1 events only, no Spec ID event.
		var b []byte
		le := binary.LittleEndian
		b = le.AppendUint32(b, 0)
		b = le.AppendUint32(b, evSeparator)
		b = append(b, make([]byte, 20)...)
		b = le.AppendUint32(b, 4)
		return append(b, 0, 0, 0, 0)
	}()
	cases := []struct {
		name, substr string
		log          []byte
		pcrs         map[int][]byte
	}{
		{"a changed PCR value", "replay", log, with(func(m map[int][]byte) { m[4][0] ^= 1 })},
		{"an unmeasured PCR that is not zero", "PCR 3 has no event", log, with(func(m map[int][]byte) { m[3][31] = 1 })},
		{"a log missing its last event", "replay", dropped, pcrs},
		{"a log with an event too many", "replay", extra, pcrs},
		{"an unexpected event in PCR 7", "secure boot state", buildEventLog(badSB), replayLog(badSB)},
		{"a TPM 1.2 log", "no SHA-256", sha1Only, pcrs},
		{"garbage", "parse", []byte("not an event log at all"), pcrs},
		{"a truncated log", "", log[:len(log)-3], pcrs},
		{"an oversized log", "more than", make([]byte, attest.MaxEventLogSize+1), pcrs},
		{"no PCRs", "no PCR values", log, nil},
		{"PCR 24", "PCR 24", log, with(func(m map[int][]byte) { m[24] = make([]byte, 32) })},
		{"a negative PCR", "PCR -1", log, with(func(m map[int][]byte) { m[-1] = make([]byte, 32) })},
		{"a SHA-1 sized value", "20 bytes", log, with(func(m map[int][]byte) { m[2] = make([]byte, 20) })},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := attest.ReplayEventLog(tc.log, tc.pcrs)
			if got != nil {
				t.Fatal("returned a result with an error")
			}
			requireEventLogError(t, err, tc.substr)
		})
	}
}

func requireEventLogError(t *testing.T, err error, substr string) {
	t.Helper()
	if err == nil {
		t.Fatal("accepted")
	}
	t.Log(err)
	if !errors.Is(err, attest.ErrEventLog) {
		t.Fatalf("error %v does not wrap ErrEventLog", err)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q does not mention %q", err, substr)
	}
}

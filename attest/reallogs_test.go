package attest_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-tpm/tpm2"

	evtestdata "github.com/google/go-eventlog/testdata"

	"github.com/nodetrust/nodetrust/attest"
)

// realLog is a firmware measurement log captured on a real or cloud
// machine, with its SHA-256 PCR values 0–7 and the SHA-256 digests of the
// EFI applications it measured into PCR 4.
//
// The logs are go-eventlog's importable testdata package (v0.0.2's logs;
// the module graph selects the later pseudo-version go-tpm-tools v0.4.10
// requires, whose files for these logs are byte-identical). go-eventlog
// keeps their PCR values and application digests only in its
// tpmeventlog/replay_test.go, so they are carried over here as constants.
type realLog struct {
	name string
	log  []byte
	pcrs [8]string
	apps []string // nil: not recorded by go-eventlog
}

var realLogs = []realLog{
	{
		name: "Rhel8GCE", log: evtestdata.Rhel8EventLog,
		pcrs: [8]string{
			"24af52a4f429b71a3184a6d64cddad17e54ea030e2aa6576bf3a5a3d8bd3328f",
			"454220afaa80c83c3839f6cccd8b3c88bf4f562316a9dda1121c578c9e005a53",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"758a3d35f1b0ff5b135dacd07db0c8132c0ac665d944090d4bf96e66447a245c",
			"53d0ee36163219201e686167bbb71ec505b3ba2917b9d9183ed84aad26cfeb89",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"5fd54361d580eb7592adb8deb236ff35444ceeac7148f24b3de63c041f12b3da",
		},
		apps: []string{
			"40d6cae02973789080cf4c3a9ad11b5a0a4d8bba4438ab96e276cc784454dee7",
			"e8a268c431da72caaae407f729f602b9dbf5d1d43492d4a51cc2b688a08586e3",
			"e4c0382f98feaebfd43923a85fd6da9a20e1a48524a4d5928c31850ca1a96a6e",
		},
	},
	{
		name: "UbuntuAmdSevGCE", log: evtestdata.Ubuntu1804AmdSevEventLog,
		pcrs: [8]string{
			"0f35c214608d93c7a6e68ae7359b4a8be5a0e99eea9107ece427c4dea4e439cf",
			"add81cbc06b154716ac7bd5999c84cbc520184d57c58102657d270274508d9ce",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"b4b94e840fc9352e20bdb5b456b4c242af0fb146755b6935d8eda000ea368a31",
			"0b75168095fd6464ff1f9943b762ec009a3ae84c5e76cf67361e16b9db30d28e",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"61af3f499f1a86be54458fd30d193fa913a7e23ca3103fa3d0abaefd3cd4f9b8",
		},
		apps: []string{
			"2ea4cb6a1f1eb1d3dce82d54fde26ded243ba3e18de7c6d211902a594fe56788",
			"835f940e97bac2f7c171819b1fcc4bebe72a1c4ea7d7245088ef32d253085bb3",
		},
	},
	{
		name: "Ubuntu2104NoDbxGCE", log: evtestdata.Ubuntu2104NoDbxEventLog,
		pcrs: [8]string{
			"24af52a4f429b71a3184a6d64cddad17e54ea030e2aa6576bf3a5a3d8bd3328f",
			"f7dab5fda6b082e0ec1a12c43dd996ee409111422cda752a784620313039db19",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"295aeaeacad1d507930bab18418f905eeda633ea67b2ab94c5e5fd3a4d47ac58",
			"e4f1359accfe48b19af7d38e98a3f373116b55b7f7a6f58f826f409a91d9fd28",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"ca37324eeffabd318d30a20f15bf27ce25dc33e2c9856279ff6c2ced58b02efa",
		},
		apps: []string{
			"d99c93fcb042dbe52707bbde371c75fcf081dd5b0c88a195d44cc57536f6f521",
			"b0a836fec2faf4a9bea0e1a5f1945bc86ddc03ac98ce0ae172ed9b1e536d7595",
		},
	},
	{
		name: "Ubuntu2104NoSecureBootGCE", log: evtestdata.Ubuntu2104NoSecureBootEventLog,
		pcrs: [8]string{
			"24af52a4f429b71a3184a6d64cddad17e54ea030e2aa6576bf3a5a3d8bd3328f",
			"45ed8540f34db53220ef197e5fb8a3835b2095454349e445f397f13d91c509a5",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"ebc7ae25d0347868250995c9a8fff16bf79e048453262d0ef2756e213c76181c",
			"47715f9f2c10769da6ee23be5633fd88e247caf162f4eeb0b6f8482ccfeadfb5",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"0d8847bc5eca06452df10e2f214363845c7ac11d47525a5474e225e72ce25dfe",
		},
		apps: []string{
			"6265b732b005b3f330bcd1843374e5ec6ec5aef27cdb97a23daeb8580abbf526",
			"b0a836fec2faf4a9bea0e1a5f1945bc86ddc03ac98ce0ae172ed9b1e536d7595",
		},
	},
	{
		name: "Ubuntu2404AmdSevSnp", log: evtestdata.Ubuntu2404AmdSevSnpEventLog,
		pcrs: [8]string{
			"50597a27846e91d025eef597abbc89f72bff9af849094db97b0684d8bc4c515e",
			"57344e1cc8c6619413df33013a7cd67915459f967395af41db21c1fa7ca9c307",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"abe8b3fa6aecb36c2fd93c6f6edde661c21b353d007410a2739d69bfa7e1b9be",
			"0b0e1903aeb1bff649b82dba2cdcf5c4ffb75027e54f151ab00b3b989f16a300",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"33ad69850fb2c7f30b4f8b4bc10ed93fc954dc07fa726e84f50f3d192dc1c140",
		},
		apps: []string{
			"724de6844dd0fe618ba5776c7bca0728be38a6544e24e44ef259b987b7abce80",
			"5e8cb75acdf8e09e5fc14cc2d6ce0c2288af208976d97309851c661e91ec1e03",
		},
	},
	{
		name: "GlinuxNoSecureBootLaptop", log: evtestdata.GlinuxAlexEventLog,
		pcrs: [8]string{
			"0e5ea849d7647a1ac1becc096fee4df98f00f8015f934afadaab0b8aa20b38a5",
			"9750400838980c9419764b9cf19c975c0e159c18ebe21cb897c6e834a8d8d433",
			"970096d49105b0404999173e49c3f6b8597b9c4c5ff6a9e364b55ce01037578e",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"ddb124ca9013f1e42f98537f7f381e47c5e6caa988cf2b4088f452c5a8dd912d",
			"fb58603615cfec59c0428e71913d30d45f38e4280380cc814135a7659c246b13",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"9d1be46302bc4f5055c90a0376d9142e397ca8744f387c9824170f1bc855fde5",
		},
	},
	{
		name: "ArchLinuxWorkstation", log: evtestdata.ArchLinuxWorkstationEventLog,
		pcrs: [8]string{
			"758b773d94feabf52ef5a4c00a7ad2c80d8d6e6d9d58756150be9bc973da9087",
			"bfda688a5d320123fddb3fc70b746bc17647e2e7f2f96e130d429542bf4622d5",
			"65dee4a48cde677aa89fa83c5c35e883fda658f743853e3ebad504ca6702f7c5",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"925d453d3dfef4ac0c72c957402163d45fa95d05e6d53f047263a3a60b598325",
			"202522f005ef625588bb7c9e21335ba96a63c5086306138885b3bb2c381730ca",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3b4a4db44b7a872524055364e62e897ae678e0d47ab0809f65c3a4ed77f66ab9",
		},
	},
	{
		name: "COS85AmdSev", log: evtestdata.Cos85AmdSevEventLog,
		pcrs: [8]string{
			"0f35c214608d93c7a6e68ae7359b4a8be5a0e99eea9107ece427c4dea4e439cf",
			"6eb40f5b6bfafcb9914d486ce59404acd24bc13a6a3c45cda3b44c9d7053d638",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"d690bdac2aa8b73a1d718cb91990df07d0747b07ea57b3b2d0f0d511f0d90491",
			"e9e0b32564b6f8215b1bd43954d9f910682d39c3b18abd4737ac3b797cf269e0",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3365d7fa2b024c852913c06e04ffbfa6ea5289f743bbf1a76f7ffdf21ed84793",
		},
		apps: []string{
			"dba8d69ffb244496ac8ab2950695d3da539d6ac5ec660fc6b4bdde245284cf23",
			"f7bad83f87940312e4642530a9a6242e88529dc37a497d7d4e7c1c070566d542",
			"6f6afb3caed004e727200a0c310731bd8ab4cd391b2d95cedf67d08e1e8e5e7e",
		},
	},
	{
		name: "COS93AmdSev", log: evtestdata.Cos93AmdSevEventLog,
		pcrs: [8]string{
			"0f35c214608d93c7a6e68ae7359b4a8be5a0e99eea9107ece427c4dea4e439cf",
			"6eb40f5b6bfafcb9914d486ce59404acd24bc13a6a3c45cda3b44c9d7053d638",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"871e8343044ae4c87b402dcb94b5e49715b1b8dc1b19c43ba0801422fabb39d4",
			"74be59dc8066011eade913db9a3db7978f93852c04816cba9427dd59b87042cc",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3365d7fa2b024c852913c06e04ffbfa6ea5289f743bbf1a76f7ffdf21ed84793",
		},
		apps: []string{
			"27cce48e55b3bfb6eb6206a4cc2b53a497846496a6264495006ab28dffa5623e",
			"e3e226fb8c8e3b3fdb56c706a0fbfda080f34068aef5a1889c1bfa95f04c2e72",
			"dc0aca594caee03705bcfa817e7f666692d89b713815f4793b7abbc2a0e00b6c",
		},
	},
	{
		name: "COS101AmdSev", log: evtestdata.Cos101AmdSevEventLog,
		pcrs: [8]string{
			"0f35c214608d93c7a6e68ae7359b4a8be5a0e99eea9107ece427c4dea4e439cf",
			"6eb40f5b6bfafcb9914d486ce59404acd24bc13a6a3c45cda3b44c9d7053d638",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"6d9f1a1d461cf77517e8d4c488c53f338a71c5a8e2b81ab7011c14f72cbc9a80",
			"d1a1ab23a5c3d98fbacff3891bad42d8e9257d61e1f683f42c6c9fa949bf96c5",
			"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
			"2bc6edaa921f953cec0ffb28dad4f87114886603d6a782036502d28e69d97a48",
		},
		apps: []string{
			"c7ac5d44444affd8d4a7c5d3dea0ce20a71e05812fc18777a428d092f78ae3ff",
			"c5d3b47de11a9a2a4a15ef5cb7202d7800a10609c0dcecc46e3e963d476b76ce",
			"af4161084115c9d5c1872f4473fe974b535e3a9a767688293720ac2cc6f7f9a3",
			"af4161084115c9d5c1872f4473fe974b535e3a9a767688293720ac2cc6f7f9a3",
		},
	},
}

// realLogWant is what each real log must yield: its Secure Boot state, or
// the reason ReplayEventLog refuses it.
var realLogWant = map[string]struct {
	secureBoot bool
	refused    string
}{
	"Rhel8GCE":                  {secureBoot: true},
	"UbuntuAmdSevGCE":           {},
	"Ubuntu2104NoDbxGCE":        {},
	"Ubuntu2104NoSecureBootGCE": {},
	"Ubuntu2404AmdSevSnp":       {},
	"COS85AmdSev":               {secureBoot: true},
	"COS93AmdSev":               {secureBoot: true},
	"COS101AmdSev":              {secureBoot: true},
	// go-attestation cannot tell these logs' Secure Boot state, so they
	// are refused with its reason (go-eventlog lists the same failures).
	"GlinuxNoSecureBootLaptop": {refused: "negative serial number"},
	"ArchLinuxWorkstation":     {refused: "SecureBoot data len is 0"},
}

func (r realLog) pcrMap(t testing.TB) map[int][]byte {
	t.Helper()
	m := map[int][]byte{}
	for i, s := range r.pcrs {
		v, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		m[i] = v
	}
	return m
}

// TestBootStateRealLogs replays go-eventlog's real firmware logs against
// their recorded SHA-256 PCR values, reads their boot state, and refuses
// every tampered variant.
func TestBootStateRealLogs(t *testing.T) {
	for _, r := range realLogs {
		t.Run(r.name, func(t *testing.T) {
			want, ok := realLogWant[r.name]
			if !ok {
				t.Fatalf("no expectation for %s", r.name)
			}
			pcrs := r.pcrMap(t)
			el, err := attest.ReplayEventLog(r.log, pcrs)
			if want.refused != "" {
				requireEventLogError(t, err, want.refused)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			bs := el.BootState()
			checkBootState(t, bs, want.secureBoot)
			if r.apps != nil {
				var got []string
				for _, a := range bs.BootApplications {
					got = append(got, hex.EncodeToString(a.Digest[:]))
				}
				if strings.Join(got, " ") != strings.Join(r.apps, " ") {
					t.Errorf("boot applications %v, want %v", got, r.apps)
				}
			}
			checkTampered(t, r.log, pcrs)
		})
	}
}

// TestBootStateRHEL8 checks what the RHEL 8 log says in detail: shim
// verified by Microsoft's UEFI CA in db, GRUB loaded from the ESP, and the
// kernel verified by the Red Hat certificate shim carries.
func TestBootStateRHEL8(t *testing.T) {
	r := realLogs[0]
	if r.name != "Rhel8GCE" {
		t.Fatalf("realLogs[0] is %s", r.name)
	}
	el, err := attest.ReplayEventLog(r.log, r.pcrMap(t))
	if err != nil {
		t.Fatal(err)
	}
	bs := el.BootState()
	cn := func(as []attest.Authority) []string {
		var out []string
		for _, a := range as {
			out = append(out, a.Certificate.Subject.CommonName)
		}
		return out
	}
	if got := cn(bs.Authorities); strings.Join(got, "|") != "Microsoft Corporation UEFI CA 2011|Red Hat Secure Boot CA 5" {
		t.Errorf("authorities %q", got)
	}
	if len(bs.BootApplications) != 3 {
		t.Fatalf("%d boot applications, want shim, GRUB and the kernel", len(bs.BootApplications))
	}
	shim, grub, kernel := bs.BootApplications[0], bs.BootApplications[1], bs.BootApplications[2]
	if got := cn(shim.Authorities); len(got) != 1 || got[0] != "Microsoft Corporation UEFI CA 2011" {
		t.Errorf("shim verified by %q", got)
	}
	if len(grub.Authorities) != 0 || !strings.EqualFold(grub.Path, `\EFI\redhat\grubx64.efi`) {
		t.Errorf("GRUB: path %q, authorities %q", grub.Path, cn(grub.Authorities))
	}
	if got := cn(kernel.Authorities); len(got) != 1 || got[0] != "Red Hat Secure Boot CA 5" {
		t.Errorf("kernel verified by %q", got)
	}
	if k := bs.Kernel(); k == nil || k.Digest != kernel.Digest || k.Path != "" {
		t.Errorf("Kernel() = %+v", k)
	}
	if bs.PK.Hashes != 0 || len(bs.PK.Certificates) != 1 || len(bs.KEK.Certificates) != 1 || len(bs.DB.Certificates) != 2 || len(bs.DBX.Certificates) != 3 || bs.DBX.Hashes != 183 {
		t.Errorf("PK %d/%d KEK %d db %d dbx %d/%d", len(bs.PK.Certificates), bs.PK.Hashes, len(bs.KEK.Certificates), len(bs.DB.Certificates), len(bs.DBX.Certificates), bs.DBX.Hashes)
	}
	for _, a := range bs.Authorities {
		if a.SHA256 != sha256Of(a.Certificate.Raw) {
			t.Errorf("%s: SHA256 is not the certificate's", a.Certificate.Subject)
		}
	}
}

// TestBootStateGoAttestationLogs replays the logs of go-attestation v0.6.4's
// attest/testdata (from the module cache) against PCR values computed by an
// independent replay, and refuses its SHA-1-only logs.
func TestBootStateGoAttestationLogs(t *testing.T) {
	for _, tc := range []struct {
		file       string
		secureBoot bool
		apps       int
	}{
		{"sb_cert_eventlog", true, 3},
		{"ubuntu_2104_shielded_vm_no_secure_boot_eventlog", false, 2},
		{"coreos_36_shielded_vm_no_secure_boot_eventlog", false, 2},
	} {
		t.Run(tc.file, func(t *testing.T) {
			log := readGoAttestationLog(t, tc.file)
			pcrs := replayAgileLog(t, log)
			el, err := attest.ReplayEventLog(log, pcrs)
			if err != nil {
				t.Fatal(err)
			}
			bs := el.BootState()
			checkBootState(t, bs, tc.secureBoot)
			if len(bs.BootApplications) != tc.apps {
				t.Errorf("%d boot applications, want %d", len(bs.BootApplications), tc.apps)
			}
			checkTampered(t, log, pcrs)
		})
	}
	t.Run("crypto_agile_eventlog (Secure Boot state unknown)", func(t *testing.T) {
		log := readGoAttestationLog(t, "crypto_agile_eventlog")
		_, err := attest.ReplayEventLog(log, replayAgileLog(t, log))
		requireEventLogError(t, err, "SecureBoot data len is 0")
	})
	for _, file := range []string{"option_rom_eventlog", "ebs_event_missing_eventlog", "short_no_action_eventlog"} {
		t.Run(file+" (SHA-1 only)", func(t *testing.T) {
			_, err := attest.ReplayEventLog(readGoAttestationLog(t, file), zeroPCRs())
			requireEventLogError(t, err, "no SHA-256")
		})
	}
	t.Run("Debian 10 from go-eventlog (SHA-1 only)", func(t *testing.T) {
		_, err := attest.ReplayEventLog(evtestdata.Debian10EventLog, zeroPCRs())
		requireEventLogError(t, err, "no SHA-256")
	})
}

func checkBootState(t *testing.T, bs *attest.BootState, secureBoot bool) {
	t.Helper()
	if !bs.SecureBootKnown || bs.SecureBoot != secureBoot {
		t.Fatalf("Secure Boot known %v on %v, want on %v", bs.SecureBootKnown, bs.SecureBoot, secureBoot)
	}
	if !bs.PCR4Known || len(bs.BootApplications) == 0 {
		t.Fatalf("PCR 4 known %v with %d boot applications", bs.PCR4Known, len(bs.BootApplications))
	}
	if secureBoot {
		if len(bs.Authorities) == 0 || len(bs.PK.Certificates) == 0 || len(bs.KEK.Certificates) == 0 || len(bs.DB.Certificates)+bs.DB.Hashes == 0 {
			t.Fatalf("Secure Boot on with %d authorities, PK %d, KEK %d, db %d", len(bs.Authorities), len(bs.PK.Certificates), len(bs.KEK.Certificates), len(bs.DB.Certificates))
		}
		if len(bs.BootApplications[0].Authorities) == 0 {
			t.Errorf("the first boot application has no authority")
		}
	}
}

// checkTampered refuses each tampered variant of a log that replays to
// pcrs: every PCR value changed, the last boot application removed, a
// boot application's digest changed, and a Secure Boot variable's data
// changed under its digest.
func checkTampered(t *testing.T, log []byte, pcrs map[int][]byte) {
	t.Helper()
	for i := range 8 {
		bad := cloneMap(pcrs)
		bad[i][7] ^= 0x01
		if _, err := attest.ReplayEventLog(log, bad); err == nil {
			t.Errorf("PCR %d changed: accepted", i)
		}
	}
	events := agileEvents(t, log)
	lastApp, variable := -1, -1
	for i, e := range events {
		if e.pcr == 4 && e.typ == evEFIBootServicesApp {
			lastApp = i
		}
		if e.pcr == 7 && e.typ == evEFIVariableDriverCf && variable < 0 {
			variable = i
		}
	}
	if lastApp < 0 || variable < 0 {
		t.Fatalf("the log has no boot application (%d) or Secure Boot variable (%d)", lastApp, variable)
	}
	app := events[lastApp]
	removed := append(bytes.Clone(log[:app.off]), log[app.end:]...)
	_, err := attest.ReplayEventLog(removed, pcrs)
	requireEventLogError(t, err, "PCRs [4]")

	changed := bytes.Clone(log)
	changed[app.sha256] ^= 0x80
	_, err = attest.ReplayEventLog(changed, pcrs)
	requireEventLogError(t, err, "PCRs [4]")

	v := events[variable]
	changed = bytes.Clone(log)
	changed[v.dataEnd-1] ^= 0x01
	_, err = attest.ReplayEventLog(changed, pcrs)
	requireEventLogError(t, err, "secure boot state")
}

// agileEvent locates one TCG_PCR_EVENT2 in a crypto-agile log.
type agileEvent struct {
	pcr      int
	typ      uint32
	off, end int // the whole event
	sha256   int // offset of its SHA-256 digest
	dataEnd  int // end of its data
}

// agileEvents walks a crypto-agile log (PC Client Platform Firmware
// Profile, section 10.2) without go-attestation.
func agileEvents(t testing.TB, log []byte) []agileEvent {
	t.Helper()
	le := binary.LittleEndian
	pos := 0
	take := func(n int) []byte {
		if n < 0 || pos+n > len(log) {
			t.Fatalf("truncated log at %d", pos)
		}
		b := log[pos : pos+n]
		pos += n
		return b
	}
	take(28)
	spec := take(int(le.Uint32(take(4))))
	sizes := map[uint16]int{}
	for i := range int(le.Uint32(spec[24:28])) {
		off := 28 + 4*i
		sizes[le.Uint16(spec[off:])] = int(le.Uint16(spec[off+2:]))
	}
	var out []agileEvent
	for pos < len(log) {
		e := agileEvent{off: pos, sha256: -1}
		e.pcr = int(le.Uint32(take(4)))
		e.typ = le.Uint32(take(4))
		for range int(le.Uint32(take(4))) {
			alg := le.Uint16(take(2))
			if alg == uint16(tpm2.TPMAlgSHA256) {
				e.sha256 = pos
			}
			take(sizes[alg])
		}
		take(int(le.Uint32(take(4))))
		e.dataEnd, e.end = pos, pos
		out = append(out, e)
	}
	return out
}

var goAttestationDir = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/google/go-attestation").Output()
	return strings.TrimSpace(string(out)), err
})

// readGoAttestationLog reads a log of go-attestation's attest/testdata
// from the module cache, where `go mod download` puts it.
func readGoAttestationLog(t testing.TB, name string) []byte {
	t.Helper()
	dir, err := goAttestationDir()
	if err != nil || dir == "" {
		t.Fatalf("find go-attestation in the module cache (run 'go mod download'): %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "attest", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sha256Of(b []byte) [32]byte { return sha256.Sum256(b) }

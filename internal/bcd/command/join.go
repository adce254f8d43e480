package command

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/atomicfile"
	"github.com/nodetrust/nodetrust/internal/bcd"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/doctor"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/internal/bcd/journal"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fileperm"
	"github.com/nodetrust/nodetrust/internal/version"
	"github.com/nodetrust/nodetrust/pki"
)

// claimsRootEnv points hardware claims at another folder tree than the
// host's (a development knob: tests join many nodes from one machine).
const claimsRootEnv = "NODETRUST_DEBUG_CLAIMS_ROOT"

type joinFlags struct {
	conn                              connFlags
	role, nodeID, tokenFile, attestor string
	logLevel                          string
	reset, yes                        bool
}

func joinCommand() *cobra.Command {
	var f joinFlags
	c := &cobra.Command{
		Use:   "join",
		Short: "Join the control plane and store this machine's identity",
		Long: `join creates this machine's identity: a P-256 key and a certificate from the
control plane. The join token comes from exactly one source: standard input,
--token-file, or the BCD_JOIN_TOKEN environment variable — never the command line.

On a machine whose identity loads, join reads no token, prints "already joined
as …" and exits 0, so it can run on every boot.

An identity that loads but no longer works — revoked (the journal knows) or
expired — makes join fail with the way back: --reset --yes moves it aside and
joins again (with a fresh token, or --attestor tpm for a machine the control
plane knows by its EK). Without --yes, --reset only prints what would move and
exits 2; it needs only the data directory (--data-dir, or config.toml's).

The attestor is --attestor, else [join] attestor of config.toml, else token.
With tpm, a token file that does not exist is no token, and an installed
machine (<data_dir>/devid holds lak.keyrec from bcd intake) joins with that
LAK instead of a new AK and sends its LAK certificate; its boot checks are
then quoted by the LAK (docs/install.md). A machine without a
DMI product UUID or serial (many VMs) cannot be recognised when it joins
again: name its node (--node-id here, or a token made with --node-id).

The data directory is refused when other users may write it or another user
owns it; the message gives the chmod or chown to run.

Without a config file, --server, the three pin flags and --data-dir bootstrap
the machine from the control plane's well-known document.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				// Never echo the argument: it may be a token.
				return cli.Usagef("bcd join takes no arguments; pass the join token on standard input, with --token-file or in %s, never on the command line", TokenEnv)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return runJoin(cmd, f) },
	}
	fl := c.Flags()
	f.conn.register(fl)
	fl.StringVar(&f.role, "role", "", "role to join as (default: role of config.toml, else the token's)")
	fl.StringVar(&f.nodeID, "node-id", "", "node id to join as (default: the token's, or one the control plane picks)")
	fl.StringVar(&f.tokenFile, "token-file", "", "read the join token from this file")
	fl.StringVar(&f.attestor, "attestor", "", "how the machine proves itself: token, or tpm (the TPM's EK; a token too for a machine the control plane does not know yet) (default: [join] attestor of config.toml, else token)")
	fl.BoolVar(&f.reset, "reset", false, "move the current identity aside first (with --yes; alone it shows what would move)")
	fl.BoolVar(&f.yes, "yes", false, "with --reset: really move the identity aside")
	fl.StringVar(&f.logLevel, "log-level", "warn", "debug, info, warn or error")
	return c
}

func runJoin(cmd *cobra.Command, f joinFlags) error {
	if f.attestor != "" {
		if err := config.ValidAttestor("--attestor", f.attestor); err != nil {
			return cli.Usagef("%v", err)
		}
	}
	if f.yes && !f.reset {
		return cli.Usagef("--yes goes with --reset")
	}
	if f.reset && !f.yes {
		// A dry run only looks at the data directory: it needs no pins,
		// so a broken machine can be looked at with --data-dir alone.
		dir, err := f.conn.dataDirOnly()
		if err != nil {
			return err
		}
		return reset(cmd, dir, false)
	}
	cfg, err := f.conn.resolve()
	if err != nil {
		return err
	}
	attestor := f.attestor
	if attestor == "" {
		attestor = cfg.Join.Attestor
	}
	if attestor == "" {
		attestor = config.AttestorToken
	}
	stderr := cmd.ErrOrStderr()
	warn := func(msg string) { fmt.Fprintln(stderr, "bcd: warning: "+msg) }
	jc := agent.JoinConfig{
		Servers:    cfg.Addresses(),
		ServerName: cfg.ServerName,
		Pins:       cfg.Pins,
		DataDir:    cfg.DataDir,
		Role:       f.role,
		NodeID:     f.nodeID,
		Version:    version.Version,
		Logger:     cli.NewLogger(stderr, f.logLevel),
	}
	if jc.Role == "" {
		jc.Role = cfg.Role
	}
	if f.conn.server == "" {
		if jc.JWK, err = cfg.ReadJWK(); err != nil {
			return err
		}
	}
	if err := checkDataDir(jc.DataDir, cfg); err != nil {
		return err
	}
	if err := checkDataDirAccess(jc.DataDir); err != nil {
		return err
	}
	if f.reset {
		if err := reset(cmd, jc.DataDir, true); err != nil {
			return err
		}
	}
	t, closeTPM, err := bcd.OpenTPM(cfg.TPM, cfg.HelperSocket(), attestor == config.AttestorTPM, warn)
	if err != nil {
		return err
	}
	defer closeTPM()
	jc.TPM, jc.Attestor = t, attestor
	if t != nil && attestor == config.AttestorTPM && (cfg.BootCheck.EventLog != "" || !strings.HasPrefix(cfg.TPM, "tcp://")) {
		if jc.EventLog, err = readEventLog(eventLogOf(cfg)); err != nil {
			return err
		}
	}
	src := tokenSource{file: f.tokenFile, stdin: cmd.InOrStdin(), terminal: isTerminal(cmd.InOrStdin()),
		optional: attestor == config.AttestorTPM, warn: warn}
	src.env, src.envSet = os.LookupEnv(TokenEnv)
	jc.Token = src.read
	jc.Claims = hwclaims.Read(os.Getenv(claimsRootEnv))
	jc.Waiting = func(msg string, next time.Duration) {
		fmt.Fprintf(stderr, "bcd: waiting for the control plane's approval (%s); asking again in %s\n", msg, next)
	}

	underHelper := cfg.Helper.Enabled() && cli.IsRoot()
	if underHelper {
		jc.Record = func(signed *joinv1.SignedJoinResult) error {
			return writeJoinRecord(cfg.Helper.HostconfigDir, signed)
		}
	}
	res, err := agent.Join(cmd.Context(), jc)
	if err != nil {
		return err
	}
	id := res.State.Identity
	if res.Already {
		// An identity that loads may still be dead: "already joined"
		// would hide that, on every boot.
		if err := checkLive(jc.DataDir, res.State, attestor, timeNow()); err != nil {
			return err
		}
	} else {
		appendJournal(cmd, jc.DataDir, journal.KindJoined, id.NodeID, fmt.Sprintf("serial %s generation %d", pki.SerialHex(res.State.Leaf), id.Generation))
	}
	if underHelper && !res.Already {
		if err := handOver(jc.DataDir, cfg.Helper.User); err != nil {
			return err
		}
	}
	verb := "joined as"
	if res.Already {
		verb = "already joined as"
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s (site %s, role %s); certificate valid until %s\n",
		verb, id.NodeID, siteOrDash(id.Site), id.Role, res.State.Leaf.NotAfter.UTC().Format(time.RFC3339))
	if !res.Already && !jc.Claims.Identifiable() {
		warn(noDMIWarning(id.NodeID))
	}
	return nil
}

// noDMIWarning tells the operator of a machine without DMI identity (many
// VMs) that the control plane cannot recognise it, and how to name it.
func noDMIWarning(node string) string {
	return fmt.Sprintf("this machine reports no DMI product UUID or serial (common on VMs), so the control plane cannot recognise it "+
		"when it joins again: after bcd join --reset it becomes a new node unless it is named. To come back as %s, join with a token "+
		"made with fleetd token create --node-id %s --allow-reclaim; to choose the name of a new node, pass bcd join --node-id NAME", node, node)
}

// checkDataDir refuses a data directory other users may change (writable
// by others, or owned by another user than root, this one or the [helper]
// user), with the chmod or chown to run.
func checkDataDir(dir string, cfg *config.BCD) error {
	return checkDataDirNamed(dir, "the data directory", cfg)
}

// checkDataDirNamed is checkDataDir for a folder of bcd's named what.
func checkDataDirNamed(dir, what string, cfg *config.BCD) error {
	var owners []uint32
	if cfg != nil && cfg.Helper.Enabled() {
		if uid, _, err := cfg.Helper.IDs(); err == nil {
			owners = append(owners, uid)
		}
	}
	return fileperm.CheckDir(dir, what, 0o700, owners...)
}

// checkLive fails, with the way back, for an identity that loads but is
// dead: the journal recorded its revocation, or its certificate expired.
func checkLive(dir string, st *identity.State, attestor string, now time.Time) error {
	if st.Identity.Attestor != "" {
		attestor = st.Identity.Attestor
	}
	node := st.Identity.NodeID
	if rv := revocation(dir, node); rv != nil {
		return fmt.Errorf("this machine is joined as %s, but %s; join again: %s", node, doctor.RevokedMessage(node, rv), identity.WayBack(attestor))
	}
	if now.After(st.Leaf.NotAfter) {
		return fmt.Errorf("this machine is joined as %s, but its certificate expired at %s and an expired certificate never renews; join again: %s",
			node, st.Leaf.NotAfter.UTC().Format(time.RFC3339), identity.WayBack(attestor))
	}
	return nil
}

// revocation is the journal's record of node's certificate's end, or nil
// (also when the journal cannot be read: the identity decides then).
func revocation(dir, node string) *doctor.Revocation {
	e, err := journal.Revocation(dir, node)
	if err != nil || e == nil {
		return nil
	}
	return &doctor.Revocation{Time: e.Time, Refused: e.Kind == journal.KindRefused, Detail: e.Detail}
}

// reset moves the identity aside (--reset --yes) or shows what would move
// and exits 2 (--reset alone).
func reset(cmd *cobra.Command, dir string, yes bool) error {
	plan := identity.ResetPlan(dir)
	out := cmd.OutOrStdout()
	if !yes {
		if len(plan) == 0 {
			fmt.Fprintf(out, "nothing to move in %s\n", dir)
		} else {
			fmt.Fprintln(out, "bcd join --reset would move aside:")
			for _, p := range plan {
				fmt.Fprintf(out, "  %s\n", p)
			}
		}
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("dry run: nothing moved; run again with --reset --yes to move these and join")}
	}
	var oldNode string
	if st, err := identity.LoadState(dir, identity.LoadOptions{}); err == nil {
		oldNode = st.Identity.NodeID
	}
	moved, err := identity.MoveAside(dir, time.Now())
	if err != nil {
		return fmt.Errorf("move the identity aside: %w", err)
	}
	for _, p := range moved {
		fmt.Fprintf(out, "moved aside: %s\n", p)
	}
	if oldNode != "" {
		appendJournal(cmd, dir, journal.KindReset, oldNode, fmt.Sprintf("%d files moved aside", len(moved)))
	}
	return nil
}

// appendJournal records an event in the node's journal; a journal that
// cannot be written is a warning, never a failure of the identity.
func appendJournal(cmd *cobra.Command, dir, kind, nodeID, detail string) {
	j, err := journal.Open(dir, time.Now)
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "bcd: warning: journal: %v\n", err)
		return
	}
	defer j.Close()
	if err := j.Append(cmd.Context(), kind, nodeID, detail); err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "bcd: warning: journal: %v\n", err)
	}
}

// checkDataDirAccess refuses early, with the way forward, when the data
// directory cannot be written by this user (the system directory needs
// root).
func checkDataDirAccess(dir string) error {
	probe := dir
	for {
		if _, err := os.Stat(probe); err == nil {
			break
		}
		parent := filepath.Dir(probe)
		if parent == probe {
			break
		}
		probe = parent
	}
	f, err := os.CreateTemp(probe, ".bcd-write-check-")
	if err != nil {
		if cli.IsRoot() {
			return fmt.Errorf("cannot write to %s: %w", probe, err)
		}
		return fmt.Errorf("cannot write the identity to %s (%v): run bcd join as root, or pass --data-dir with a folder you own", dir, err)
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	return nil
}

func siteOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// eventLogOf is the boot's event log: [boot_check] event_log, else where
// Linux exposes the firmware's.
func eventLogOf(cfg *config.BCD) string {
	if cfg.BootCheck.EventLog != "" {
		return cfg.BootCheck.EventLog
	}
	return config.DefaultEventLog
}

// readEventLog reads the boot's measurement log; a host without one (no
// securityfs, a TPM the firmware did not measure into) has none.
func readEventLog(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the boot event log %s (run bcd join as root): %w", path, err)
	}
	return b, nil
}

// joinRecordFile is root's copy of the verified join response, which bcd
// helper reads the node id from.
const joinRecordFile = "join-response.pb"

// writeJoinRecord writes the verified, signed join response to dir
// (0700) as join-response.pb (0600), before the identity is stored.
func writeJoinRecord(dir string, signed *joinv1.SignedJoinResult) error {
	b, err := proto.Marshal(signed)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, joinRecordFile), b, 0o600)
}

// handOver gives the identity's files to the [helper] user so the
// unprivileged bcd node can read them. Lchown: a name swapped for a
// symlink changes only the link, never what it points at.
func handOver(dir, userName string) error {
	uid, gid, err := config.Helper{User: userName}.IDs()
	if err != nil {
		return err
	}
	names := append([]string{"", datadir.IdentityFile, datadir.KeyFile}, datadir.JournalFiles()...)
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.Lchown(p, int(uid), int(gid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("hand %s to the [helper] user %s: %w", p, userName, err)
		}
	}
	return nil
}

package command

import (
	"bytes"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"

	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/internal/bcd/doctor"
	"github.com/nodetrust/nodetrust/internal/cli"
	"github.com/nodetrust/nodetrust/internal/fileperm"
	"github.com/nodetrust/nodetrust/tpm"
)

func doctorCommand() *cobra.Command {
	var conn connFlags
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Check this machine's identity, config, clock and control plane, with the way back for each problem",
		Long: `doctor runs each check and prints pass, warn or fail, and for each warning or
failure what to do. Exit status: 0 when all pass, 3 for a warning, 1 for a failure.

The identity check fails for an identity that does not load, one the journal
records as revoked (or refused by the control plane), and an expired
certificate, with the way back for the node's attestor. The permissions check
fails for a data or credentials folder other users may write or another user
owns, and warns about a join token file (join-token beside config.toml) that
others may read.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var results []doctor.Result
			cfg, cfgErr := conn.resolve()
			cfgPath := conn.config
			if conn.server != "" {
				cfgPath = "the command line"
			}
			results = append(results, doctor.CheckConfig(cfgPath, cfgErr))

			dataDir := conn.dataDir
			if cfg != nil {
				dataDir = cfg.DataDir
			}
			if dataDir != "" {
				st, err := loadState(cmd.Context(), dataDir, cfg, conn)
				facts := doctor.IdentityFacts{DataDir: dataDir, LoadErr: err, Now: timeNow()}
				if cfg != nil {
					facts.Attestor = cfg.Join.Attestor
				}
				if err == nil {
					facts.Leaf = st.Leaf
					if st.Identity.Attestor != "" {
						facts.Attestor = st.Identity.Attestor
					}
					facts.Revoked = revocation(dataDir, st.Identity.NodeID)
				}
				results = append(results, doctor.CheckIdentity(facts))
				results = append(results, permissions(dataDir, cfg, conn.config))
			}
			if cfg != nil {
				results = append(results, doctor.CheckTPM(tpmFacts(cfg)))
				addr := cfg.Addresses()[0]
				offset, err := agent.ClockOffset(cmd.Context(), addr, cfg.ServerName, cfg.Pins.ServingCA)
				results = append(results, doctor.CheckReachable(addr, err))
				if err == nil {
					results = append(results, doctor.CheckClock(offset, nil))
				}
			}
			doctor.Print(cmd.OutOrStdout(), results)
			if code := doctor.ExitCode(doctor.Worst(results)); code != 0 {
				return &cli.ExitError{Code: code}
			}
			return nil
		},
	}
	conn.register(c.Flags())
	return c
}

// permissions checks the data and credentials folders (and the install
// script's token file beside config.toml) as bcd join and bcd node do.
func permissions(dataDir string, cfg *config.BCD, cfgPath string) doctor.Result {
	problems := []error{
		checkDataDir(dataDir, cfg),
		checkDataDirNamed(datadir.Layout(dataDir).Credentials(), "the credentials folder", cfg),
	}
	var tokenFile string
	var tokenMode fs.FileMode
	if cfg != nil {
		p := filepath.Join(filepath.Dir(cfgPath), "join-token")
		if open, mode, err := fileperm.OthersCanRead(p); err == nil && open {
			tokenFile, tokenMode = p, mode
		}
	}
	return doctor.CheckPermissions("the data directory "+dataDir+" and its credentials folder are", problems, tokenFile, tokenMode)
}

// tpmFacts gathers what the TPM check judges: where the node key is, and
// whether the [helper] user could open the TPM itself.
func tpmFacts(cfg *config.BCD) doctor.TPMFacts {
	f := doctor.TPMFacts{HelperUser: cfg.Helper.User}
	keyPath := datadir.Layout(cfg.DataDir).Key()
	if b, err := os.ReadFile(keyPath); err == nil {
		switch {
		case !bytes.Contains(b, []byte(tpm.KeyRecordPEMType)):
			f.KeyWhere = "file " + keyPath
		case cfg.Helper.Enabled():
			f.KeyWhere = "TPM through bcd helper (" + cfg.Helper.Socket + "), record in " + keyPath
		default:
			f.KeyWhere = "TPM (tpm = " + cfg.TPM + "), record in " + keyPath
		}
	}
	if cfg.Helper.Enabled() {
		f.HelperUserInTSS = inGroup(cfg.Helper.User, "tss")
	}
	return f
}

// inGroup reports whether the user is a member of the group.
func inGroup(userName, group string) bool {
	u, err := user.Lookup(userName)
	if err != nil {
		return false
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return false
	}
	ids, err := u.GroupIds()
	if err != nil {
		return false
	}
	return slices.Contains(ids, g.Gid)
}

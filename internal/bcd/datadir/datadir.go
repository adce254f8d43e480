package datadir

import "path/filepath"

// The names of what bcd keeps in its data directory (seed 000, "Files").
const (
	// IdentityFile is identity.json: the identity as JSON, mode 0600.
	IdentityFile = "identity.json"
	// KeyFile is node.key: the node key as PEM (a PKCS#8 key, or the
	// record from which the TPM derives it), mode 0600.
	KeyFile = "node.key"
	// NextKeyFile is node.key.next: a renewal's next key while it is
	// stored, mode 0600.
	NextKeyFile = "node.key.next"
	// JournalFile is journal.db: the node's append-only journal (SQLite).
	JournalFile = "journal.db"
	// RunDir holds the local API's socket and each running instance's
	// files (mode 0700).
	RunDir = "run"
	// SocketFile is the local API's socket in RunDir.
	SocketFile = "bcd.sock"
	// InstancesDir, in RunDir, holds one folder per start of an instance.
	InstancesDir = "instances"
	// CredentialsDir holds the command line's key (mode 0700).
	CredentialsDir = "credentials"
	// CLIKeyFile is the command line's Ed25519 key in CredentialsDir.
	CLIKeyFile = "command_line.key"
)

// JournalSidecars are the suffixes of the files SQLite keeps beside
// journal.db; they move and change owner with it.
var JournalSidecars = []string{"-wal", "-shm", "-journal"}

// Layout is a data directory: each method returns the full path of one of
// its files or folders.
type Layout string

// Dir is the data directory itself.
func (l Layout) Dir() string { return string(l) }

// Identity is <dir>/identity.json.
func (l Layout) Identity() string { return filepath.Join(string(l), IdentityFile) }

// Key is <dir>/node.key.
func (l Layout) Key() string { return filepath.Join(string(l), KeyFile) }

// NextKey is <dir>/node.key.next.
func (l Layout) NextKey() string { return filepath.Join(string(l), NextKeyFile) }

// Journal is <dir>/journal.db.
func (l Layout) Journal() string { return filepath.Join(string(l), JournalFile) }

// JournalFiles are journal.db and its sidecars' names, journal.db first.
func JournalFiles() []string {
	names := []string{JournalFile}
	for _, s := range JournalSidecars {
		names = append(names, JournalFile+s)
	}
	return names
}

// Run is <dir>/run.
func (l Layout) Run() string { return filepath.Join(string(l), RunDir) }

// Socket is the local API's default socket, <dir>/run/bcd.sock.
func (l Layout) Socket() string { return filepath.Join(string(l), RunDir, SocketFile) }

// Instances is <dir>/run/instances.
func (l Layout) Instances() string { return filepath.Join(string(l), RunDir, InstancesDir) }

// Credentials is <dir>/credentials.
func (l Layout) Credentials() string { return filepath.Join(string(l), CredentialsDir) }

// CLIKey is <dir>/credentials/command_line.key.
func (l Layout) CLIKey() string { return filepath.Join(string(l), CredentialsDir, CLIKeyFile) }

package fileperm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"slices"
	"strconv"
	"syscall"
)

// ErrUnsafe is wrapped by every [*Problem]: a folder others may write, or
// one another user owns.
var ErrUnsafe = errors.New("unsafe permissions")

// Problem is a folder whose permissions let another user change what it
// holds, with the command that repairs it.
type Problem struct {
	// What names the folder for the operator ("the data directory").
	What string
	Path string
	// Why says what is wrong, such as "is writable by others (mode 0777)".
	Why string
	// Fix is the command that repairs it, such as "chmod 0700 /var/lib/bcd".
	Fix string
}

func (p *Problem) Error() string {
	return fmt.Sprintf("%s %s %s: another user could replace what it holds; run: %s", p.What, p.Path, p.Why, p.Fix)
}

func (p *Problem) Unwrap() error { return ErrUnsafe }

// CheckDir returns a [*Problem] when the folder at path (followed if it is
// a symlink) is writable by others, or is owned by a user other than root,
// this process's user and those of owners (the [helper] user, say). mode is
// the mode the fix proposes (0700 for a folder of secrets). A folder that
// does not exist is no problem: its creator makes it with the right mode.
// Other errors reading it are returned as they are.
func CheckDir(path, what string, mode fs.FileMode, owners ...uint32) error {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &Problem{What: what, Path: path, Why: "is not a folder", Fix: fmt.Sprintf("mv %s %s.aside, then run the command again", path, path)}
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return &Problem{What: what, Path: path,
			Why: fmt.Sprintf("is writable by others (mode %04o)", fi.Mode().Perm()),
			Fix: fmt.Sprintf("chmod %04o %s", mode.Perm(), path)}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	me := uint32(os.Geteuid())
	if st.Uid == 0 || st.Uid == me || slices.Contains(owners, st.Uid) {
		return nil
	}
	return &Problem{What: what, Path: path,
		Why: fmt.Sprintf("is owned by %s, not by root or %s", userName(st.Uid), userName(me)),
		Fix: fmt.Sprintf("chown %s %s", userName(me), path)}
}

// OthersCanRead reports whether users other than the file's owner and group
// may read the file at path, and its mode.
func OthersCanRead(path string) (bool, fs.FileMode, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return false, 0, err
	}
	return fi.Mode().Perm()&0o004 != 0, fi.Mode().Perm(), nil
}

// userName is the name of uid, or the number when it has none.
func userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return id
}

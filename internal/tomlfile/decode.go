package tomlfile

import (
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// Decode reads a TOML file into v and refuses settings v does not
// have, so a misspelt key is an error rather than silently ignored.
func Decode(path string, v any) error {
	md, err := toml.DecodeFile(path, v)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return fmt.Errorf("%s: unknown setting %s", path, strings.Join(keys, ", "))
	}
	return nil
}

// Package tomlfile reads the TOML configuration files of fleetd and bcd the
// same way: unknown settings are errors, and durations are Go duration
// strings. Each binary's config package owns its own settings.
package tomlfile

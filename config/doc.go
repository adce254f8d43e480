// Package config reads and validates the TOML configuration files of fleetd
// (fleetd.toml) and bcd (config.toml). Every problem is reported with the
// setting's name, so an operator knows which line to fix; a malformed pin
// stops the program at start.
package config

// Package config reads and validates fleetd's fleetd.toml. Every problem is
// reported with the setting's name, so an operator knows which line to fix.
package config

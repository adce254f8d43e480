// Package config reads and validates bcd's config.toml. Every problem is
// reported with the setting's name, so an operator knows which line to fix;
// a malformed pin stops the program at start.
package config

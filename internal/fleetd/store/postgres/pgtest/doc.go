// Package pgtest starts throwaway PostgreSQL clusters for tests: initdb in
// a new folder, the server on a free loopback port, a new database for
// each test that asks. As root it runs the server as the postgres user
// (PostgreSQL refuses to run as root). With NODETRUST_TEST_POSTGRES_DSN
// set, it uses that server instead and starts nothing.
//
// Under CI (CI=true) a missing PostgreSQL fails the test and says what is
// missing; elsewhere the test is skipped with a one-line reason. scripts/deps.sh
// installs Debian's postgresql. Imported by the postgres store's tests and
// the end-to-end tests only.
package pgtest

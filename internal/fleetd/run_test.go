package fleetd

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/config"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
)

func TestConnectionLimitsFitTheOpenFileLimit(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	def := service.DefaultLimits

	t.Run("defaults that fit are kept", func(t *testing.T) {
		l, err := connectionLimits(&config.Fleetd{HTTPListen: "127.0.0.1:0"}, 1<<20, log)
		if err != nil || l.MaxConns != def.MaxConns || l.HTTPMaxConns != def.HTTPMaxConns {
			t.Fatalf("limits %+v, %v: want the defaults", l, err)
		}
	})
	t.Run("an unset max_connections is lowered to fit", func(t *testing.T) {
		l, err := connectionLimits(&config.Fleetd{HTTPListen: "127.0.0.1:0"}, 4096, log)
		if err != nil {
			t.Fatal(err)
		}
		if total := l.MaxConns + l.HTTPMaxConns + fdReserve; total > 4096 || l.MaxConns <= 0 || l.HTTPMaxConns <= 0 {
			t.Fatalf("limits %+v use %d descriptors of 4096", l, total)
		}
	})
	t.Run("without https the grpc listener gets the room", func(t *testing.T) {
		l, err := connectionLimits(&config.Fleetd{}, 4096, log)
		if err != nil || l.MaxConns != 4096-fdReserve {
			t.Fatalf("limits %+v, %v: want max_connections %d", l, err, 4096-fdReserve)
		}
	})
	t.Run("a set max_connections that does not fit is an error", func(t *testing.T) {
		cfg := &config.Fleetd{Limits: config.Limits{MaxConnections: 50000}}
		_, err := connectionLimits(cfg, 20000, log)
		if err == nil || !strings.Contains(err.Error(), "limits.max_connections") || !strings.Contains(err.Error(), "LimitNOFILE") {
			t.Fatalf("err = %v, want one naming the setting and the way to raise the limit", err)
		}
	})
	t.Run("a tiny open-file limit is an error", func(t *testing.T) {
		if _, err := connectionLimits(&config.Fleetd{}, 100, log); err == nil {
			t.Fatal("an open-file limit of 100 was accepted")
		}
	})
}

package main

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
	"github.com/sandbox-sidecar/sandbox-sidecar/runwatch"
)

// AirflowSection configures the run-end watcher (docs/operations.md, "The
// end of a run ends its sandboxes"): off unless api_url is set.
type AirflowSection struct {
	// APIURL is the Airflow API server, e.g. "http://airflow-api-server:8080".
	APIURL string `toml:"api_url"`
	// CredentialFile holds a read-only credential of the daemon's own: a
	// token (auth = "bearer") or user:password (auth = "basic").
	CredentialFile string   `toml:"credential_file"`
	Auth           string   `toml:"auth"`
	RunPath        string   `toml:"run_path"`
	PollInterval   Duration `toml:"poll_interval"`
	RequestTimeout Duration `toml:"request_timeout"`
}

func (a AirflowSection) watcherConfig() runwatch.Config {
	return runwatch.Config{BaseURL: a.APIURL, CredentialFile: a.CredentialFile, Auth: a.Auth, RunPath: a.RunPath,
		Interval: a.PollInterval.D(), RequestTimeout: a.RequestTimeout.D()}
}

func (a AirflowSection) validate() []error {
	if a.APIURL == "" {
		return nil
	}
	var errs []error
	if err := a.watcherConfig().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("airflow: %w", err))
	}
	if a.PollInterval.D() < minPollInterval {
		errs = append(errs, fmt.Errorf("airflow.poll_interval must be at least %s", minPollInterval))
	}
	if a.RequestTimeout.D() <= 0 {
		errs = append(errs, fmt.Errorf("airflow.request_timeout must be greater than 0"))
	}
	return errs
}

// minPollInterval keeps a typo from hammering the API server.
const minPollInterval = 100 * time.Millisecond // tests use short ones

// startRunWatch is the one place that starts the run-end watcher; stop
// ends it. Off (a no-op stop) without airflow.api_url.
func startRunWatch(cfg AirflowSection, mgr *lifecycle.Manager, log hclog.Logger) (stop func(), err error) {
	if cfg.APIURL == "" {
		return func() {}, nil
	}
	wc := cfg.watcherConfig()
	wc.Manager, wc.Logger = mgr, log.Named("runwatch")
	w, err := runwatch.New(wc)
	if err != nil {
		return nil, fmt.Errorf("airflow: %w", err)
	}
	w.Start()
	log.Info("ending the sandboxes of finished DAG runs", "api_url", cfg.APIURL, "poll_interval", cfg.PollInterval.D())
	return w.Close, nil
}

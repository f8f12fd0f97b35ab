package sbx

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/registry"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/statedir"
)

// Layout of Dir/<id>.
const (
	workspaceName = "workspace"       // mounted into the microVM at its host path
	specName      = registry.SpecName // persistedSpec
	probeName     = ".sidecar-probe"  // Create's token, in the workspace until the probe read it
)

// Network values reported in backend.Info.
const (
	// networkNone: a deny-all host and no per-sandbox rule.
	networkNone = "none"
	// networkAllowList: a deny-all host plus a per-sandbox allow rule for
	// the spec's allow_egress_to.
	networkAllowList = "allowlist"
	// networkOpen: an allow-all host; the sandbox reaches everything.
	networkOpen = "open"
	// networkUnknown: the host's policy was not declared.
	networkUnknown = "unknown"
)

// Bounds on per-sandbox state.
const (
	// specVersion is the version of persistedSpec written by this code.
	specVersion = 1
	// maxEgressHosts bounds allow_egress_to.
	maxEgressHosts = 64
)

// errSandboxDestroyed is the cancellation cause Destroy gives running
// operations, so Exec can tell "destroyed under you" from "request ended".
var errSandboxDestroyed = registry.ErrDestroyed

// persistedSpec is spec.json: what a restarted daemon needs to keep using a
// sandbox it finds on disk, and to remove it.
type persistedSpec struct {
	Version       int               `json:"version"`
	SbxName       string            `json:"sbx_name"`
	Network       string            `json:"network"`
	AllowEgressTo []string          `json:"allow_egress_to,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
}

func (s persistedSpec) SpecVersion() int { return s.Version }

// sandbox is the in-memory state of one sandbox: its settings and the
// operations in flight, so Destroy can stop them and wait for them.
type sandbox struct {
	id, dir string
	name    string // the sbx sandbox name
	env     map[string]string
	network string

	ops registry.Ops // the operations in flight, so Destroy can stop them

	startMu  sync.Mutex // held while ensureRunning starts a stopped microVM
	mu       sync.Mutex // guards sessions and lastUsed
	sessions int        // sbx execs running in it (they keep it from stopping)
	lastUsed time.Time  // when the last one ended, or it was made or started
}

func newSandbox(id, dir string, spec persistedSpec) *sandbox {
	return &sandbox{id: id, dir: dir, name: spec.SbxName, env: spec.Env, network: spec.Network, ops: registry.Ops{ID: id}}
}

// Ops are the sandbox's operations in flight (registry.Sandbox).
func (sb *sandbox) Ops() *registry.Ops { return &sb.ops }

// workspace is the sandbox's working directory, the same path on the host
// and in the guest.
func (sb *sandbox) workspace() string { return filepath.Join(sb.dir, workspaceName) }

// begin registers one operation (registry.Ops.Begin).
func (sb *sandbox) begin(ctx context.Context) (context.Context, func(), error) {
	return sb.ops.Begin(ctx)
}

func vanished(id string) error {
	return fmt.Errorf("%w: the microVM of sandbox %q is gone (sbx no longer lists it: removed behind the daemon's back, or sbx lost it); create a new sandbox", backend.ErrNotFound, id)
}

func (b *Backend) sandboxDir(id string) string { return filepath.Join(b.cfg.Dir, id) }

// sbxName is the sbx name of sandbox id: the marker, '-', the id.
func (b *Backend) sbxName(id string) string { return b.cfg.Marker + "-" + id }

// idFromName returns the sandbox id an sbx name carries when it carries this
// backend's marker.
func (b *Backend) idFromName(name string) (string, bool) {
	id, ok := strings.CutPrefix(name, b.cfg.Marker+"-")
	if !ok || !backend.ValidID(id) {
		return "", false
	}
	return id, true
}

// lookup returns sandbox id, loading it from disk when this process has not
// seen it yet (a restarted daemon re-adopting its sandboxes). It does not ask
// sbx: a microVM that vanished is noticed when a command fails.
func (b *Backend) lookup(id string) (*sandbox, error) { return b.boxes.Lookup(id) }

// registryHooks are what the backend's registry needs to know of its
// sandboxes.
func (b *Backend) registryHooks() registry.Hooks[*sandbox] {
	return registry.Hooks[*sandbox]{
		Load: func(id string) (*sandbox, error) {
			spec, err := b.loadSpec(id)
			if err != nil {
				return nil, err
			}
			sb := newSandbox(id, b.sandboxDir(id), spec)
			if _, err := os.Stat(sb.workspace()); err != nil {
				return nil, backend.NotFound(id)
			}
			return sb, nil
		},
		Usable: func(sb *sandbox) error {
			if _, err := os.Stat(sb.workspace()); err != nil {
				return backend.NotFound(sb.id)
			}
			return nil
		},
		Exists: func(sb *sandbox) bool {
			_, err := os.Lstat(sb.dir)
			return err == nil
		},
		Placeholder: func(id string) *sandbox { return newSandbox(id, b.sandboxDir(id), persistedSpec{}) },
	}
}

// Adopt takes sandbox id back after a restart: its settings must load,
// its workspace exist, and sbx must still list its microVM (which outlives
// the daemon: nothing else needs re-making). A microVM sbx no longer has is
// ErrNotFound; an sbx that cannot answer is ErrUnavailable.
func (b *Backend) Adopt(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox %s was not adopted: %w", id, err)
	}
	sb, err := b.lookup(id)
	if err != nil {
		return err
	}
	has, err := b.sbxHas(ctx, sb.name)
	switch {
	case err != nil:
		return fmt.Errorf("%w: cannot tell whether the microVM of sandbox %s still exists: %v", backend.ErrUnavailable, id, err)
	case !has:
		return fmt.Errorf("%w: the microVM of sandbox %q is gone (sbx no longer lists %s); destroy it and create a new one", backend.ErrNotFound, id, sb.name)
	}
	return nil
}

func (b *Backend) loadSpec(id string) (persistedSpec, error) {
	var spec persistedSpec
	if err := registry.LoadSpec(b.sandboxDir(id), id, specVersion, &spec); err != nil {
		return spec, err
	}
	if spec.SbxName != b.sbxName(id) {
		return spec, fmt.Errorf("%w: sandbox %q was created under another marker (sbx name %s); destroy it and create a new one", backend.ErrNotFound, id, backend.ShortName(spec.SbxName))
	}
	if err := backend.ValidateEnv(spec.Env, "the sandbox's"); err != nil {
		return spec, fmt.Errorf("sandbox %s has bad settings on disk (%w); destroy it and create a new one", id, err)
	}
	return spec, nil
}

// Create makes Dir/<id> with its workspace and spec.json, then the microVM:
// sbx create (with a deny of every destination for no network), a
// per-sandbox allow rule when the spec lists hosts (refused beforehand
// under an organisation's governance), a read-back of the policy in force
// (network.go), a start should sbx have stopped it already, and a probe
// that the guest has the tools the backend relies on and sees, and can
// write, the workspace at its host path. A failure part-way removes the
// microVM and the directory before returning.
func (b *Backend) Create(ctx context.Context, id string, spec backend.Spec) (_ backend.Info, err error) {
	if !backend.ValidID(id) {
		return backend.Info{}, fmt.Errorf("%w: sandbox id %q is not a valid id (lowercase letters, digits and '-', at most 63)", backend.ErrInvalidArgument, id)
	}
	if err := ctx.Err(); err != nil {
		return backend.Info{}, fmt.Errorf("sandbox %s was not created: %w", id, err)
	}
	plan, err := networkFor(b.cfg.HostPolicy, spec)
	if err != nil {
		return backend.Info{}, err
	}
	network, hosts := plan.network, plan.hosts
	template, err := b.templateFor(spec.Image)
	if err != nil {
		return backend.Info{}, err
	}
	if err := backend.ValidateEnv(spec.Env, "the sandbox's"); err != nil {
		return backend.Info{}, err
	}
	if err := checkEnvFile(spec.Env, "the sandbox's"); err != nil {
		return backend.Info{}, err
	}
	resourceArgs, err := b.resourceArgs(spec.Resources)
	if err != nil {
		return backend.Info{}, err
	}
	log := b.log.With("sandbox", id)
	name := b.sbxName(id)

	dir := b.sandboxDir(id)
	if b.boxes.KnownAndPresent(id) {
		return backend.Info{}, fmt.Errorf("sandbox %q already exists or is being destroyed; destroy it first or choose another id: %w", id, fs.ErrExist)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return backend.Info{}, fmt.Errorf("sandbox %q already exists; destroy it first or choose another id: %w", id, err)
		}
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w; check that the state directory is writable", id, err)
	}
	created := false // sbx create was started, so a microVM may exist
	defer func() {
		if err == nil {
			return
		}
		// Detached: a cancelled request must not leave a half-made microVM.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout+b.cfg.ListTimeout)
		defer cancel()
		if created {
			if rmErr := b.removeMicroVM(cctx, name); rmErr != nil {
				// Keep the directory: List keeps reporting the id, so the
				// caller's destroy (or the next sweep) retries the removal.
				log.Error("cannot remove the half-made microVM; keeping its directory so a destroy can retry", "error", rmErr)
				err = fmt.Errorf("%w (and the half-made microVM %s could not be removed: %v; destroy sandbox %s to retry)", err, name, rmErr, id)
				return
			}
		}
		if rmErr := statedir.RemoveAll(dir); rmErr != nil {
			log.Error("cannot remove the half-made sandbox's directory", "error", rmErr)
		}
	}()

	ws := filepath.Join(dir, workspaceName)
	if err := os.Mkdir(ws, 0o755); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	saved := persistedSpec{Version: specVersion, SbxName: name, Network: network, AllowEgressTo: hosts, Env: maps.Clone(spec.Env)}
	// Before the microVM exists: a crash from here on leaves a directory
	// List reports, and the record names the microVM to remove.
	if err := registry.SaveSpec(dir, saved); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: save its settings: %w", id, err)
	}
	token, err := writeProbeToken(ws)
	if err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}

	if len(hosts) > 0 {
		// Under an organisation's governance local allow rules are
		// inactive: an allow-list would be no network at all.
		org, err := b.governance(ctx)
		if err != nil {
			return backend.Info{}, fmt.Errorf("sandbox %s was not created: %w", id, err)
		}
		if org != "" {
			return backend.Info{}, fmt.Errorf("%w: the host's sbx policy is governed by an organisation (%s), which makes local allow rules inactive, so allow_egress_to cannot be granted per sandbox; ask the organisation's admins to allow the hosts, or use block_network", backend.ErrSpecUnenforceable, org)
		}
	}

	args := append([]string{"create", "--name", name}, resourceArgs...)
	if plan.deny {
		args = append(args, "--deny-network", denyAll)
	}
	// --pull missing: the default, always, asks the registry on every
	// create, so a template pulled once (or by an operator) saves nothing
	// and a registry outage stops every create.
	args = append(args, "--pull", "missing", "--template", template, "shell", ws)
	created = true
	start := time.Now()
	res, runErr := b.runSbx(ctx, b.cfg.CreateTimeout, cliOutputBytes, nil, args...)
	switch {
	case runErr != nil && ctx.Err() != nil:
		return backend.Info{}, fmt.Errorf("sandbox %s was not created: the request ended during sbx create: %w", id, ctx.Err())
	case res.TimedOut:
		return backend.Info{}, fmt.Errorf("%w: sbx create of sandbox %s did not finish within %v (a first boot pulls %s); retry, or raise the create timeout on a slow link", backend.ErrUnavailable, id, b.cfg.CreateTimeout, b.cfg.Template)
	case runErr == nil && operatorNeeded(res) != nil:
		return backend.Info{}, fmt.Errorf("sandbox %s was not created: %w", id, operatorNeeded(res))
	case runErr != nil || res.ExitCode != 0:
		detail := failure(res, runErr, b.cfg.CreateTimeout)
		hint := "check that sbx is logged in (sbx login), that its policy is initialised (sbx policy init), and the sbx daemon's log"
		if strings.Contains(strings.ToLower(string(res.Stderr)+string(res.Stdout)), "already exists") {
			hint = "sbx reports a leftover with this name, which a crashed sbx daemon can leave behind without listing it (sbx-releases#353); restart the sbx daemon, then retry"
		}
		return backend.Info{}, fmt.Errorf("%w: sbx create of sandbox %s failed (%s); %s", backend.ErrUnavailable, id, detail, hint)
	}
	log.Debug("microVM created", "sbx_name", name, "duration", time.Since(start))
	sb := newSandbox(id, dir, saved)
	sb.touch() // sbx stops it a grace after create if no session comes

	if len(hosts) > 0 {
		res, runErr := b.runSbx(ctx, policyTimeout, cliOutputBytes, nil,
			"policy", "allow", "network", "--sandbox", name, strings.Join(sbxPatterns(hosts), ","))
		if need := operatorNeeded(res); runErr == nil && need != nil {
			return backend.Info{}, fmt.Errorf("sandbox %s was not created: %w", id, need)
		}
		if runErr != nil || res.ExitCode != 0 || res.TimedOut {
			return backend.Info{}, fmt.Errorf("%w: cannot allow sandbox %s to reach %s: sbx policy allow network failed (%s); the sandbox was removed, check sbx policy ls and retry", backend.ErrSpecUnenforceable, id, strings.Join(hosts, ", "), failure(res, runErr, policyTimeout))
		}
	}

	if network, err = b.verifyNetwork(ctx, name, plan); err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if network != saved.Network {
		saved.Network, sb.network = network, network
		if err := registry.SaveSpec(dir, saved); err != nil {
			return backend.Info{}, fmt.Errorf("create sandbox %s: save its settings: %w", id, err)
		}
	}

	if err := b.ensureRunning(ctx, sb); err != nil {
		if errors.Is(err, errGone) {
			err = fmt.Errorf("%w: sbx no longer lists the new microVM %s", backend.ErrUnavailable, name)
		}
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	endSession := sb.session()
	err = b.probe(ctx, name, ws, token)
	endSession()
	if err != nil {
		return backend.Info{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	_ = os.Remove(filepath.Join(ws, probeName))

	if err := b.boxes.Created(id, sb); err != nil {
		return backend.Info{}, err
	}
	log.Info("sandbox created", "sbx_name", name, "network", network, "allowed_hosts", len(hosts), "env_vars", len(spec.Env), "duration", time.Since(start))
	return backend.Info{Workdir: ws, Network: network}, nil
}

func writeProbeToken(ws string) (string, error) {
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := hex.EncodeToString(raw)
	if err := os.WriteFile(filepath.Join(ws, probeName), []byte(token), 0o644); err != nil {
		return "", fmt.Errorf("write the workspace probe: %w", err)
	}
	return token, nil
}

// Destroy stops the sandbox's running operations, removes its microVM
// (sbx rm -f; a microVM sbx does not have counts as removed) and then its
// directory. It is idempotent, and an id that is not a valid id succeeds
// without touching anything. The removal runs detached from ctx with its own
// deadline; ctx only shortens the wait for running operations. When the
// microVM cannot be removed the directory is kept, so the id stays listed
// and a later Destroy retries.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if !backend.ValidID(id) {
		return nil
	}
	sb, _ := b.boxes.Destroying(id)
	defer b.boxes.Done(id, sb)

	log := b.log.With("sandbox", id)
	if !sb.ops.Stop(ctx, registry.DestroyWait) {
		log.Warn("running operations did not all end in time; removing the sandbox anyway", "waited_up_to", registry.DestroyWait)
	}
	return b.destroyStopped(ctx, id, log)
}

// destroyStopped removes the microVM and the directory of a sandbox whose
// operations are stopped (or that Exec gave up on).
func (b *Backend) destroyStopped(ctx context.Context, id string, log hclog.Logger) error {
	name := b.sbxName(id)
	if spec, err := b.loadSpec(id); err == nil {
		name = spec.SbxName
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout+b.cfg.ListTimeout)
	defer cancel()
	if err := b.removeMicroVM(cctx, name); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w; its files are kept so that destroy can be retried", id, err)
	}
	dir := b.sandboxDir(id)
	_, statErr := os.Lstat(dir)
	if err := statedir.RemoveAll(dir); err != nil {
		return fmt.Errorf("destroy sandbox %s: its microVM is removed but its files could not all be (%w); call destroy again to retry", id, err)
	}
	if statErr == nil {
		log.Info("sandbox destroyed", "sbx_name", name)
	}
	return nil
}

// removeMicroVM runs sbx rm -f name. sbx exits non-zero for a sandbox it
// does not have, so a failure counts as success only when sbx ls then
// confirms the name is gone; an sbx that cannot answer is an error.
func (b *Backend) removeMicroVM(ctx context.Context, name string) error {
	res, runErr := b.runSbx(ctx, removeTimeout, cliOutputBytes, nil, "rm", "-f", name)
	if runErr == nil && res.ExitCode == 0 && !res.TimedOut {
		return nil
	}
	exists, lsErr := b.sbxHas(ctx, name)
	switch {
	case lsErr != nil:
		return fmt.Errorf("%w: sbx rm -f %s failed (%s) and sbx ls cannot tell whether it is gone (%v); check the sbx daemon", backend.ErrUnavailable, name, failure(res, runErr, removeTimeout), lsErr)
	case exists:
		return fmt.Errorf("%w: sbx rm -f %s failed (%s) and sbx still lists it; check the sbx daemon's log", backend.ErrUnavailable, name, failure(res, runErr, removeTimeout))
	}
	return nil
}

// List returns the ids of every sandbox carrying this backend's marker:
// those sbx lists and those with a directory on disk. The directories are
// part of it because sbx ls is not the whole truth (a crashed sbx daemon can
// forget a sandbox, and a crash between sbx rm and removing the directory
// leaves only the directory). An sbx that does not answer is an error, so a
// sweep never acts on half the picture.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids, err := statedir.SandboxIDs(b.cfg.Dir)
	if err != nil {
		return nil, err
	}
	listed, err := b.listSbx(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range listed {
		if id, ok := b.idFromName(s.Name); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// lsEntry is one sandbox of sbx ls --json. Only the name is relied on.
type lsEntry struct {
	Name       string   `json:"name"`
	Agent      string   `json:"agent,omitempty"`
	Status     string   `json:"status,omitempty"`
	Workspaces []string `json:"workspaces,omitempty"`
}

// listSbx runs sbx ls --json within ListTimeout and parses it.
func (b *Backend) listSbx(ctx context.Context) ([]lsEntry, error) {
	limit := b.cfg.ListTimeout
	res, err := b.runSbx(ctx, limit, listOutputBytes, nil, "ls", "--json")
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("sbx ls was stopped because the request ended: %w", ctx.Err())
	case res.TimedOut:
		return nil, fmt.Errorf("%w: sbx ls did not answer within %v; the sbx daemon may be stuck (sbx-releases#163): check \"sbx daemon status\" and restart it", backend.ErrUnavailable, limit)
	case err == nil && operatorNeeded(res) != nil:
		return nil, operatorNeeded(res)
	case err != nil || res.ExitCode != 0:
		return nil, fmt.Errorf("%w: sbx ls failed (%s); check that sbx is logged in (sbx login) and its daemon runs", backend.ErrUnavailable, failure(res, err, limit))
	case res.StdoutTruncated:
		return nil, fmt.Errorf("%w: sbx ls --json printed more than %d bytes; remove sandboxes this host no longer needs", backend.ErrUnavailable, listOutputBytes)
	}
	entries, err := parseLs(res.Stdout)
	if err != nil {
		return nil, fmt.Errorf("%w: %v; check the sbx version (docs/sbx.md)", backend.ErrUnavailable, err)
	}
	return entries, nil
}

// sbxHas reports whether sbx lists a sandbox called name.
func (b *Backend) sbxHas(ctx context.Context, name string) (bool, error) {
	entries, err := b.listSbx(ctx)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(entries, func(e lsEntry) bool { return e.Name == name }), nil
}

// parseLs reads sbx ls --json output defensively: whatever precedes the
// JSON (a "Starting sandboxd daemon…" banner when the daemon was down) is
// skipped, as is whatever follows it. Both {"sandboxes": [...]} and a bare
// array are accepted; entries without a name are ignored.
func parseLs(out []byte) ([]lsEntry, error) {
	rest := out
	for len(rest) > 0 {
		line := bytes.TrimLeft(rest, " \t\r\ufeff")
		if len(line) > 0 && (line[0] == '{' || line[0] == '[') {
			if entries, err := decodeLs(line); err == nil {
				return entries, nil
			}
		}
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		rest = rest[i+1:]
	}
	return nil, fmt.Errorf("sbx ls --json printed no JSON listing of sandboxes (it began %s)", backend.ShortName(firstLine(out)))
}

func decodeLs(data []byte) ([]lsEntry, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, err
	}
	var list []lsEntry
	if raw[0] == '[' {
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, err
		}
	} else {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, err
		}
		field, ok := obj["sandboxes"]
		if !ok {
			return nil, errors.New(`no "sandboxes" key`)
		}
		if err := json.Unmarshal(field, &list); err != nil {
			return nil, err
		}
	}
	out := list[:0]
	for _, e := range list {
		if e.Name != "" {
			out = append(out, e)
		}
	}
	return out, nil
}

// resourceArgs turns the daemon's microVM size, lowered by what the spec
// asked for, into sbx create's options. A microVM has a kernel of its own,
// so its processes are bounded by its memory and CPUs rather than counted;
// but its workspace is a directory of the host, so a disk cap, like a
// process cap, is not something this backend can promise and is refused.
func (b *Backend) resourceArgs(r backend.Resources) ([]string, error) {
	var errs []string
	memory, cpus := b.memory, b.cfg.CPUs
	switch {
	case r.MemoryBytes == 0:
	case r.MemoryBytes < minMemoryBytes:
		errs = append(errs, fmt.Sprintf("memory_bytes %d is less than 512 MiB, the smallest microVM sbx runs", r.MemoryBytes))
	case r.MemoryBytes > b.memoryBytes:
		errs = append(errs, fmt.Sprintf("memory_bytes %d exceeds the daemon's maximum %d", r.MemoryBytes, b.memoryBytes))
	default:
		memory = fmt.Sprintf("%dm", r.MemoryBytes>>20)
	}
	switch {
	case r.CPUs == 0:
	case r.CPUs < 1 || r.CPUs != float64(int(r.CPUs)):
		errs = append(errs, fmt.Sprintf("cpus %v: a microVM gets whole CPUs", r.CPUs))
	case b.cfg.CPUs > 0 && int(r.CPUs) > b.cfg.CPUs:
		errs = append(errs, fmt.Sprintf("cpus %v exceeds the daemon's maximum %d", r.CPUs, b.cfg.CPUs))
	default:
		cpus = int(r.CPUs)
	}
	if r.PIDs != 0 {
		errs = append(errs, "pids cannot be capped per microVM (its own kernel counts them; its memory bounds them)")
	}
	if r.DiskBytes != 0 {
		errs = append(errs, "disk_bytes cannot be capped: a microVM's workspace is a directory of the host")
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %s; ask for less, or leave the field out", backend.ErrSpecUnenforceable, strings.Join(errs, "; "))
	}
	args := []string{"--memory", memory}
	if cpus > 0 {
		args = append(args, "--cpus", strconv.Itoa(cpus))
	}
	return args, nil
}

// LimitsInForce: memory and CPUs are the microVM's size; processes are
// contained by its kernel; disk, open files and file sizes are not capped
// by this backend.
func (b *Backend) LimitsInForce() map[string]string {
	cpu := "none"
	if b.cfg.CPUs > 0 {
		cpu = "microvm"
	}
	return map[string]string{
		"memory": "microvm", "cpu": cpu, "pids": "microvm", "disk": "off",
		"open_files": "microvm", "file_size": "off", "syscalls": "microvm",
	}
}

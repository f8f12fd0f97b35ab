// Package kubernetes validates the manifests under packaging/kubernetes
// without a cluster (schema downloads are not reachable in CI): every
// document is decoded strictly into its typed object from k8s.io/api, so a
// misspelt or misplaced field fails, and what the manifests promise each
// other (the socket path, the worker's uid, the image, the config the
// daemon reads) is checked, the embedded config.toml by the daemon itself.
package kubernetes

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sandbox-sidecar/sandbox-sidecar/test/internal/testdaemon"
)

var daemonBin string

func TestMain(m *testing.M) { testdaemon.Main(m, &daemonBin) }

const (
	dir        = "../../packaging/kubernetes"
	socketDir  = "/run/sandbox-sidecar"
	socketPath = socketDir + "/sidecar.sock"
	airflowUID = 50000 // the official apache/airflow image's user
)

// documents splits a YAML stream into its documents.
func documents(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

// decodeStrict decodes one document into the typed object its kind names;
// unknown fields and kinds fail.
func decodeStrict(t *testing.T, doc []byte) any {
	t.Helper()
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	require.NoError(t, yaml.Unmarshal(doc, &head))
	var obj any
	switch head.APIVersion + "/" + head.Kind {
	case "v1/Namespace":
		obj = &corev1.Namespace{}
	case "v1/ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1/Pod":
		obj = &corev1.Pod{}
	case "apps/v1/DaemonSet":
		obj = &appsv1.DaemonSet{}
	default:
		t.Fatalf("unexpected kind %s %s", head.APIVersion, head.Kind)
	}
	require.NoError(t, yaml.UnmarshalStrict(doc, obj), "%s", head.Kind)
	return obj
}

// helmValues are the keys of the official Airflow chart that
// airflow-values.yaml sets, typed as the chart passes them to the pod.
type helmValues struct {
	Workers struct {
		ExtraInitContainers []corev1.Container   `json:"extraInitContainers"`
		ExtraVolumes        []corev1.Volume      `json:"extraVolumes"`
		ExtraVolumeMounts   []corev1.VolumeMount `json:"extraVolumeMounts"`
	} `json:"workers"`
	Env []corev1.EnvVar `json:"env"`
}

func TestEveryManifestDecodesStrictly(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		if filepath.Base(f) == "airflow-values.yaml" {
			continue // Helm values, not objects: TestAirflowHelmValues
		}
		docs := documents(t, f)
		require.NotEmpty(t, docs, f)
		for _, d := range docs {
			decodeStrict(t, d)
		}
	}
	// Strictness is real: a misspelt field fails.
	bad := []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: a\n    imagee: b\n")
	assert.Error(t, yaml.UnmarshalStrict(bad, &corev1.Pod{}))
}

// checkConfig runs the daemon's own `config check` on a ConfigMap's
// config.toml and returns the text.
func checkConfig(t *testing.T, cm *corev1.ConfigMap) string {
	t.Helper()
	text, ok := cm.Data["config.toml"]
	require.True(t, ok, "the ConfigMap has config.toml")
	p := filepath.Join(t.TempDir(), "config.toml")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	var out bytes.Buffer
	cmd := exec.Command(daemonBin, "config", "check", "--config", p)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "config check: %s", out.String())
	assert.Contains(t, text, `socket = "`+socketPath+`"`)
	assert.Contains(t, text, `allow_uids = ["50000"]`, "the Airflow image's uid may connect")
	return text
}

// checkDaemonContainer checks what the daemon's container needs.
func checkDaemonContainer(t *testing.T, c corev1.Container, mounts map[string]string) {
	t.Helper()
	assert.Regexp(t, `^sandbox-sidecar:`, c.Image)
	assert.Equal(t, []string{"serve", "--config", "/etc/sandbox-sidecar/config.toml"}, c.Args)
	require.NotNil(t, c.SecurityContext)
	require.NotNil(t, c.SecurityContext.Privileged)
	assert.True(t, *c.SecurityContext.Privileged, "bubblewrap needs an unmasked /proc, unshare and mount")
	require.NotNil(t, c.StartupProbe)
	assert.Equal(t, []string{"sandbox-sidecar", "health", "--socket", socketPath}, c.StartupProbe.Exec.Command)
	got := map[string]string{}
	for _, m := range c.VolumeMounts {
		got[m.MountPath] = m.Name
	}
	for path, vol := range mounts {
		assert.Equal(t, vol, got[path], "%s mounts %s", c.Name, path)
	}
}

func TestDaemonSet(t *testing.T) {
	var ds *appsv1.DaemonSet
	var cm *corev1.ConfigMap
	var ns *corev1.Namespace
	for _, d := range documents(t, filepath.Join(dir, "daemonset.yaml")) {
		switch o := decodeStrict(t, d).(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.ConfigMap:
			cm = o
		case *corev1.Namespace:
			ns = o
		}
	}
	require.NotNil(t, ds)
	require.NotNil(t, cm)
	require.NotNil(t, ns)
	assert.Equal(t, "privileged", ns.Labels["pod-security.kubernetes.io/enforce"])
	assert.Equal(t, ns.Name, ds.Namespace)
	assert.Equal(t, ns.Name, cm.Namespace)
	checkConfig(t, cm)
	spec := ds.Spec.Template.Spec
	require.Len(t, spec.Containers, 1)
	checkDaemonContainer(t, spec.Containers[0], map[string]string{socketDir: "run", "/var/lib/sandbox-sidecar": "state", "/etc/sandbox-sidecar": "config"})
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	require.NotNil(t, vols["run"].HostPath, "the socket is on the node, for task pods to mount")
	assert.Equal(t, socketDir, vols["run"].HostPath.Path)
	require.NotNil(t, vols["state"].HostPath, "sandboxes and their journal outlive the daemon's pod")
	require.NotNil(t, vols["config"].ConfigMap)
	assert.Equal(t, cm.Name, vols["config"].ConfigMap.Name)
	assert.Equal(t, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
}

// checkNativeSidecar checks the sidecar shape: the daemon as an init
// container with restartPolicy Always, the socket's emptyDir shared with the
// worker, the worker told where it is.
func checkNativeSidecar(t *testing.T, inits []corev1.Container, vols []corev1.Volume, workerMounts []corev1.VolumeMount, env []corev1.EnvVar) {
	t.Helper()
	require.Len(t, inits, 1)
	sc := inits[0]
	require.NotNil(t, sc.RestartPolicy, "a native sidecar")
	assert.Equal(t, corev1.ContainerRestartPolicyAlways, *sc.RestartPolicy)
	checkDaemonContainer(t, sc, map[string]string{socketDir: "sandbox-sidecar-run", "/var/lib/sandbox-sidecar": "sandbox-sidecar-state", "/etc/sandbox-sidecar": "sandbox-sidecar-config"})
	byName := map[string]corev1.Volume{}
	for _, v := range vols {
		byName[v.Name] = v
	}
	require.NotNil(t, byName["sandbox-sidecar-run"].EmptyDir, "the socket is shared through an emptyDir")
	require.NotNil(t, byName["sandbox-sidecar-state"].EmptyDir)
	require.NotNil(t, byName["sandbox-sidecar-config"].ConfigMap)
	var shared bool
	for _, m := range workerMounts {
		shared = shared || (m.Name == "sandbox-sidecar-run" && m.MountPath == socketDir)
		assert.NotEqual(t, "sandbox-sidecar-state", m.Name, "the worker sees only the socket's directory")
	}
	assert.True(t, shared, "the worker mounts the socket's directory")
	assert.Contains(t, env, corev1.EnvVar{Name: "SANDBOX_SIDECAR_SOCKET", Value: socketPath})
}

func TestSidecarPod(t *testing.T) {
	var pod *corev1.Pod
	var cm *corev1.ConfigMap
	for _, d := range documents(t, filepath.Join(dir, "sidecar-pod.yaml")) {
		switch o := decodeStrict(t, d).(type) {
		case *corev1.Pod:
			pod = o
		case *corev1.ConfigMap:
			cm = o
		}
	}
	require.NotNil(t, pod)
	require.NotNil(t, cm)
	checkConfig(t, cm)
	require.Len(t, pod.Spec.Containers, 1)
	w := pod.Spec.Containers[0]
	require.NotNil(t, w.SecurityContext.RunAsUser)
	assert.EqualValues(t, airflowUID, *w.SecurityContext.RunAsUser)
	checkNativeSidecar(t, pod.Spec.InitContainers, pod.Spec.Volumes, w.VolumeMounts, w.Env)
}

func TestAirflowHelmValues(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(dir, "airflow-values.yaml"))
	require.NoError(t, err)
	var v helmValues
	require.NoError(t, yaml.UnmarshalStrict(b, &v))
	checkNativeSidecar(t, v.Workers.ExtraInitContainers, v.Workers.ExtraVolumes, v.Workers.ExtraVolumeMounts, v.Env)

	// The init container matches the plain Pod's: one shape, two spellings.
	var pod *corev1.Pod
	for _, d := range documents(t, filepath.Join(dir, "sidecar-pod.yaml")) {
		if p, ok := decodeStrict(t, d).(*corev1.Pod); ok {
			pod = p
		}
	}
	require.NotNil(t, pod)
	assert.Equal(t, pod.Spec.InitContainers, v.Workers.ExtraInitContainers)
	assert.Equal(t, pod.Spec.Volumes, v.Workers.ExtraVolumes)
}

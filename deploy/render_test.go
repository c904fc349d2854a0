package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"quotad/integration/otlptest"
	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
)

// The renderers the tests build with the Go toolchain; the Makefile's
// test-deps installs the same versions into the same directory first.
const (
	helmPkg      = "helm.sh/helm/v3/cmd/helm@v3.22.0"
	kustomizePkg = "sigs.k8s.io/kustomize/kustomize/v5@v5.8.2"
	// kubeVersion is the cluster version helm template renders for: the
	// chart needs 1.29 or later (native sidecars).
	kubeVersion = "1.31.0"
)

var tools = struct {
	sync.Mutex
	path map[string]string
}{path: map[string]string{}}

// toolsDir is where helm and kustomize are installed: QUOTAD_TOOLS_BIN, or
// quotad-tools/bin in the user's cache directory (as in the Makefile).
func toolsDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("QUOTAD_TOOLS_BIN"); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatalf("no cache directory for helm and kustomize (set QUOTAD_TOOLS_BIN): %v", err)
	}
	return filepath.Join(cache, "quotad-tools", "bin")
}

// tool returns the path of name, installing pkg with go install first (a
// no-op when the installed binary is up to date).
func tool(t *testing.T, name, pkg string) string {
	t.Helper()
	tools.Lock()
	defer tools.Unlock()
	if p, ok := tools.path[name]; ok {
		return p
	}
	dir := toolsDir(t)
	cmd := exec.Command("go", "install", pkg)
	cmd.Env = append(os.Environ(), "GOBIN="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %s: %v\n%s", pkg, err, out)
	}
	p := filepath.Join(dir, name)
	tools.path[name] = p
	return p
}

func runTool(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.Bytes()
}

// The monitoring.coreos.com/v1 kinds, reduced to the fields quotad's
// manifests use; the strict decode refuses any other field, as it would a
// typo. (The prometheus-operator module is far larger than these.)
type podMonitor struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   metadata `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type prometheusRule struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   metadata `json:"metadata"`
	Spec       ruleSpec `json:"spec"`
}

type metadata struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
}

type ruleSpec struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// rendered is a renderer's output, decoded strictly by kind.
type rendered struct {
	deployments map[string]*appsv1.Deployment
	cronJobs    map[string]*batchv1.CronJob
	configMaps  map[string]*corev1.ConfigMap
	pdbs        map[string]*policyv1.PodDisruptionBudget
	podMonitors map[string]*podMonitor
	rules       map[string]*prometheusRule
	filters     map[string]*envoyFilter
}

func decodeAll(t *testing.T, where string, data []byte) *rendered {
	t.Helper()
	r := &rendered{
		deployments: map[string]*appsv1.Deployment{}, cronJobs: map[string]*batchv1.CronJob{},
		configMaps: map[string]*corev1.ConfigMap{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		podMonitors: map[string]*podMonitor{}, rules: map[string]*prometheusRule{},
		filters: map[string]*envoyFilter{},
	}
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s document %d: %v", where, i, err)
		}
		at := fmt.Sprintf("%s: %s %s", where, meta.Kind, meta.Metadata.Name)
		var into any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			v := &appsv1.Deployment{}
			r.deployments[meta.Metadata.Name], into = v, v
		case "batch/v1 CronJob":
			v := &batchv1.CronJob{}
			r.cronJobs[meta.Metadata.Name], into = v, v
		case "v1 ConfigMap":
			v := &corev1.ConfigMap{}
			r.configMaps[meta.Metadata.Name], into = v, v
		case "policy/v1 PodDisruptionBudget":
			v := &policyv1.PodDisruptionBudget{}
			r.pdbs[meta.Metadata.Name], into = v, v
		case "monitoring.coreos.com/v1 PodMonitor":
			v := &podMonitor{}
			r.podMonitors[meta.Metadata.Name], into = v, v
		case "monitoring.coreos.com/v1 PrometheusRule":
			v := &prometheusRule{}
			r.rules[meta.Metadata.Name], into = v, v
		case "networking.istio.io/v1alpha3 EnvoyFilter":
			v := &envoyFilter{}
			r.filters[meta.Metadata.Name], into = v, v
		default:
			t.Fatalf("%s: unexpected %s %s", at, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("%s: %v", at, err)
		}
	}
	return r
}

func kustomize(t *testing.T, dir string) *rendered {
	t.Helper()
	out := runTool(t, tool(t, "kustomize", kustomizePkg), "build", dir)
	return decodeAll(t, "kustomize build "+dir, out)
}

func helmTemplate(t *testing.T, args ...string) *rendered {
	t.Helper()
	all := append([]string{"template", "quotad", filepath.Join("helm", "quotad"), "--kube-version", kubeVersion}, args...)
	out := runTool(t, tool(t, "helm", helmPkg), all...)
	return decodeAll(t, "helm "+strings.Join(all, " "), out)
}

// checkSidecarPod checks a pod spec that got quotad from a renderer: a
// native sidecar with HTTP probes on its own port, an app container on the
// same socket through an emptyDir, and config that resolves within r.
func checkSidecarPod(t *testing.T, where string, spec *corev1.PodSpec, r *rendered) *corev1.Container {
	t.Helper()
	var q *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == "quotad" {
			q = &spec.InitContainers[i]
		}
	}
	if q == nil || q.RestartPolicy == nil || *q.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("%s: no init container quotad with restartPolicy Always", where)
	}
	checkProbes(t, where, q)
	configRefs(t, where, q, r)
	volumes := map[string]*corev1.Volume{}
	for i := range spec.Volumes {
		volumes[spec.Volumes[i].Name] = &spec.Volumes[i]
	}
	for _, m := range q.VolumeMounts {
		if volumes[m.Name] == nil {
			t.Errorf("%s: quotad mounts %q, which the pod does not have", where, m.Name)
		}
	}
	sock := env(q, "QUOTAD_SOCKET")
	if sock == nil {
		t.Fatalf("%s: quotad has no QUOTAD_SOCKET", where)
	}
	dir := filepath.Dir(sock.Value)
	var shared string
	for _, m := range q.VolumeMounts {
		if m.MountPath == dir {
			shared = m.Name
		}
	}
	if v := volumes[shared]; v == nil || v.EmptyDir == nil {
		t.Fatalf("%s: the socket's directory %s is not an emptyDir quotad mounts", where, dir)
	}
	apps := 0
	for i := range spec.Containers {
		c := &spec.Containers[i]
		if m := mount(c, shared); m == nil || m.MountPath != dir {
			continue
		}
		apps++
		if e := env(c, "QUOTAD_SOCKET"); e == nil || e.Value != sock.Value {
			t.Errorf("%s: container %s mounts the socket but its QUOTAD_SOCKET is %v, not %s", where, c.Name, e, sock.Value)
		}
	}
	if apps == 0 {
		t.Errorf("%s: no container mounts the socket's volume %s at %s", where, shared, dir)
	}
	policies(t, where, spec, q, r)
	sc := q.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: quotad wants a read-only root and no privilege escalation", where)
	}
	return q
}

// policies returns the policy file the sidecar loads (QUOTAD_CONFIG, in
// a mounted ConfigMap), which must be valid and name at least one policy.
func policies(t *testing.T, where string, spec *corev1.PodSpec, q *corev1.Container, r *rendered) *policy.Config {
	t.Helper()
	cfg := env(q, "QUOTAD_CONFIG")
	if cfg == nil {
		t.Fatalf("%s: quotad has no QUOTAD_CONFIG", where)
	}
	for _, v := range spec.Volumes {
		m := mount(q, v.Name)
		if v.ConfigMap == nil || m == nil || m.MountPath != filepath.Dir(cfg.Value) {
			continue
		}
		cm := r.configMaps[v.ConfigMap.Name]
		if cm == nil {
			t.Fatalf("%s: volume %s names ConfigMap %s, which is not rendered", where, v.Name, v.ConfigMap.Name)
		}
		c, err := policy.ParseConfig([]byte(cm.Data[filepath.Base(cfg.Value)]))
		if err != nil || len(c.Policies) == 0 {
			t.Fatalf("%s: ConfigMap %s key %s: %v, %d policies", where, cm.Name, filepath.Base(cfg.Value), err, len(c.Policies))
		}
		return c
	}
	t.Fatalf("%s: QUOTAD_CONFIG %s is not in a mounted ConfigMap", where, cfg.Value)
	return nil
}

// checkProbes: startup and readiness GET /readyz, liveness GET /healthz,
// all on the container's port that QUOTAD_HTTP_ADDR listens on. None is
// /redisz: a Redis outage must not take the pod out of its Service.
func checkProbes(t *testing.T, where string, q *corev1.Container) {
	t.Helper()
	addr := env(q, "QUOTAD_HTTP_ADDR")
	if addr == nil {
		t.Fatalf("%s: quotad has no QUOTAD_HTTP_ADDR, so no probe can reach it", where)
	}
	for name, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"startup": {q.StartupProbe, "/readyz"}, "liveness": {q.LivenessProbe, "/healthz"}, "readiness": {q.ReadinessProbe, "/readyz"}} {
		if want.p == nil || want.p.HTTPGet == nil || want.p.Exec != nil {
			t.Errorf("%s: quotad's %s probe is not httpGet", where, name)
			continue
		}
		g := want.p.HTTPGet
		if g.Path != want.path {
			t.Errorf("%s: %s probe GET %s, want %s", where, name, g.Path, want.path)
		}
		port := ""
		for _, p := range q.Ports {
			if p.Name == g.Port.String() || fmt.Sprint(p.ContainerPort) == g.Port.String() {
				port = fmt.Sprint(p.ContainerPort)
			}
		}
		if port == "" || !strings.HasSuffix(addr.Value, ":"+port) {
			t.Errorf("%s: %s probe port %s is not QUOTAD_HTTP_ADDR %s", where, name, g.Port.String(), addr.Value)
		}
	}
}

// configRefs checks that every configMapKeyRef of c names a rendered
// ConfigMap and key.
func configRefs(t *testing.T, where string, c *corev1.Container, r *rendered) {
	t.Helper()
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.ConfigMapKeyRef
		cm := r.configMaps[ref.Name]
		if cm == nil {
			t.Errorf("%s: %s %s reads ConfigMap %s, which is not rendered", where, c.Name, e.Name, ref.Name)
		} else if _, ok := cm.Data[ref.Key]; !ok {
			t.Errorf("%s: %s %s reads key %s of ConfigMap %s, which has no such key", where, c.Name, e.Name, ref.Key, ref.Name)
		}
	}
}

// checkDoctor: the doctor reads Redis and the key prefix exactly as the
// sidecar does, from a ConfigMap, with the sidecar's image.
func checkDoctor(t *testing.T, where string, q *corev1.Container, r *rendered) {
	t.Helper()
	if len(r.cronJobs) != 1 {
		t.Fatalf("%s: %d CronJobs, want the doctor", where, len(r.cronJobs))
	}
	for _, cj := range r.cronJobs {
		cs := cj.Spec.JobTemplate.Spec.Template.Spec.Containers
		if len(cs) != 1 || len(cs[0].Args) == 0 || cs[0].Args[0] != "doctor" || cs[0].Image != q.Image {
			t.Fatalf("%s: CronJob %s is not the doctor on the sidecar's image", where, cj.Name)
		}
		d := &cs[0]
		configRefs(t, where, d, r)
		for _, name := range []string{"QUOTAD_REDIS_URL", "QUOTAD_KEY_PREFIX", "QUOTAD_REDIS_PASSWORD"} {
			a, b := env(q, name), env(d, name)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("%s: %s: sidecar %+v, doctor %+v; want the same", where, name, a, b)
			}
		}
		if u := env(q, "QUOTAD_REDIS_URL"); u == nil || u.ValueFrom == nil || u.ValueFrom.ConfigMapKeyRef == nil {
			t.Errorf("%s: QUOTAD_REDIS_URL is not read from a ConfigMap: %+v", where, u)
		}
	}
}

// checkSelects: the PodMonitor scrapes the pod on the sidecar's port, and
// the PDB (if any) covers it.
func checkSelects(t *testing.T, where string, d *appsv1.Deployment, q *corev1.Container, r *rendered) {
	t.Helper()
	labels := d.Spec.Template.Labels
	for _, pm := range r.podMonitors {
		if !mapsSubset(pm.Spec.Selector.MatchLabels, labels) {
			t.Errorf("%s: PodMonitor %s selects %v, not the pods of %s (%v)", where, pm.Metadata.Name, pm.Spec.Selector.MatchLabels, d.Name, labels)
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if !slices.ContainsFunc(q.Ports, func(p corev1.ContainerPort) bool { return p.Name == ep.Port }) || ep.Path != "/metrics" {
				t.Errorf("%s: PodMonitor %s scrapes port %q %s; the sidecar's ports are %v", where, pm.Metadata.Name, ep.Port, ep.Path, q.Ports)
			}
		}
	}
	for _, pdb := range r.pdbs {
		if pdb.Spec.Selector == nil || !mapsSubset(pdb.Spec.Selector.MatchLabels, labels) || pdb.Spec.MaxUnavailable == nil {
			t.Errorf("%s: PDB %s does not bound the pods of %s", where, pdb.Name, d.Name)
		}
	}
}

func TestKustomizeRendersEveryKustomization(t *testing.T) {
	base := kustomize(t, dir)
	if len(base.deployments) != 1 || len(base.pdbs) != 1 {
		t.Fatalf("deploy/kubernetes renders %d Deployments and %d PDBs, want 1 and 1", len(base.deployments), len(base.pdbs))
	}
	for _, d := range base.deployments {
		q := checkSidecarPod(t, dir, &d.Spec.Template.Spec, base)
		checkDoctor(t, dir, q, base)
		checkSelects(t, dir, d, q, base)
	}

	// The Component on a Deployment that knew nothing of quotad.
	overlay := filepath.Join(dir, "examples", "existing-app")
	ov := kustomize(t, overlay)
	web := ov.deployments["web"]
	if web == nil || len(ov.deployments) != 1 {
		t.Fatalf("%s: want the one Deployment web, got %v", overlay, ov.deployments)
	}
	q := checkSidecarPod(t, overlay, &web.Spec.Template.Spec, ov)
	checkDoctor(t, overlay, q, ov)
	if q.Image != "registry.example.com/quotad:v1.2.3" {
		t.Errorf("%s: image %s; want the overlay's images entry applied", overlay, q.Image)
	}
	if ov.configMaps["quotad-redis"].Data["url"] != "redis://redis.shared.svc.cluster.local:6379" {
		t.Errorf("%s: quotad-redis %v; want the overlay's URL over the Component's", overlay, ov.configMaps["quotad-redis"].Data)
	}
	runSidecar(t, overlay, &web.Spec.Template.Spec, q, ov)

	mon := kustomize(t, filepath.Join(dir, "monitoring"))
	if len(mon.podMonitors) != 1 || len(mon.rules) != 1 || mon.configMaps["quotad-dashboard"] == nil {
		t.Fatalf("monitoring renders %d PodMonitors, %d PrometheusRules, dashboard %v", len(mon.podMonitors), len(mon.rules), mon.configMaps["quotad-dashboard"] != nil)
	}
	for _, d := range base.deployments {
		checkSelects(t, "monitoring on "+dir, d, checkSidecarPod(t, dir, &d.Spec.Template.Spec, base), mon)
	}
	checkSelects(t, "monitoring on "+overlay, web, q, mon)
	if !json.Valid([]byte(mon.configMaps["quotad-dashboard"].Data["quotad-dashboard.json"])) {
		t.Error("the dashboard ConfigMap does not hold valid JSON")
	}

	// Copies that must not drift: a kustomization cannot read files
	// outside its directory, nor a chart outside its own.
	for a, b := range map[string]string{
		filepath.Join(dir, "doctor-cronjob.yaml"):                 filepath.Join(dir, "components", "quotad", "doctor-cronjob.yaml"),
		filepath.Join(dir, "monitoring", "quotad-dashboard.json"): filepath.Join("helm", "quotad", "dashboards", "quotad.json"),
	} {
		x, err := os.ReadFile(a)
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs from %s: copy it again", b, a)
		}
	}
}

func TestHelmChartLintsAndRenders(t *testing.T) {
	helm := tool(t, "helm", helmPkg)
	chart := filepath.Join("helm", "quotad")
	all := []string{
		"--set", "example.enabled=true,pdb.enabled=true,metrics.podMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true",
		"--set", "redis.passwordSecret.name=quotad-redis,redis.url=redis://redis.shared:6379",
	}
	// Traces go to a receiver of the test's, which the sidecar that
	// runSidecar runs exports to.
	recv := otlptest.Start(t)
	all = append(all, "--set", "tracing.endpoint="+recv.HTTPEndpoint()+",tracing.protocol=http/protobuf")
	runTool(t, helm, "lint", "--strict", chart)
	runTool(t, helm, append([]string{"lint", "--strict", chart}, all...)...)

	// values.schema.json refuses a misspelt or ill-typed value, which helm
	// would otherwise ignore.
	for _, bad := range []string{"maxConn=5", "logDecisions=some", "redis.url=redis.local:6379", "tracing.protocol=udp",
		"tracing.endpoint=collector:4317", "tracing.sampler=sometimes"} {
		cmd := exec.Command(helm, "template", "quotad", chart, "--kube-version", kubeVersion, "--set", bad)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "schema") {
			t.Errorf("helm template --set %s: %v\n%s; want a schema error", bad, err, out)
		}
	}

	// Defaults: the config and the doctor, nothing that needs CRDs.
	def := helmTemplate(t)
	if len(def.deployments)+len(def.podMonitors)+len(def.rules)+len(def.pdbs) != 0 || len(def.cronJobs) != 1 || len(def.configMaps) != 2 {
		t.Errorf("helm template with defaults renders %d Deployments, %d PodMonitors, %d rules, %d PDBs, %d CronJobs, %d ConfigMaps; want only the doctor and 2 ConfigMaps",
			len(def.deployments), len(def.podMonitors), len(def.rules), len(def.pdbs), len(def.cronJobs), len(def.configMaps))
	}

	r := helmTemplate(t, all...)
	d := r.deployments["quotad-example"]
	if d == nil || len(r.pdbs) != 1 || len(r.podMonitors) != 1 || len(r.rules) != 1 {
		t.Fatalf("helm template with everything on: Deployments %v, %d PDBs, %d PodMonitors, %d rules", r.deployments, len(r.pdbs), len(r.podMonitors), len(r.rules))
	}
	q := checkSidecarPod(t, "helm example", &d.Spec.Template.Spec, r)
	checkDoctor(t, "helm", q, r)
	checkSelects(t, "helm", d, q, r)
	runSidecar(t, "helm example", &d.Spec.Template.Spec, q, r)
	// The take's span left as the sidecar stopped, named by the pod.
	recv.WaitFor(t, "the take's span with the pod's resource attributes", waitTimeout, func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.Name == "take" && s.TraceID == renderTraceID && s.Resource["k8s.pod.name"] == podVars["metadata.name"] &&
				s.Resource["k8s.namespace.name"] == podVars["metadata.namespace"] && s.Resource["k8s.node.name"] == podVars["spec.nodeName"] &&
				s.Resource["k8s.pod.uid"] == podVars["metadata.uid"] && s.Resource["k8s.container.name"] == "quotad" &&
				s.Resource["service.name"] == "quotad" {
				return true
			}
		}
		return false
	})
	// Without an endpoint, no OTEL_ variable: tracing is off.
	for _, e := range checkSidecarPod(t, "helm without tracing", &helmTemplate(t, "--set", "example.enabled=true").deployments["quotad-example"].Spec.Template.Spec, def).Env {
		if strings.HasPrefix(e.Name, "OTEL_") {
			t.Errorf("helm without tracing.endpoint sets %s", e.Name)
		}
	}
	if p := env(q, "QUOTAD_REDIS_PASSWORD"); p == nil || p.ValueFrom.SecretKeyRef.Name != "quotad-redis" {
		t.Errorf("redis.passwordSecret.name: QUOTAD_REDIS_PASSWORD is %+v", p)
	}
	if u := r.configMaps["quotad-redis"].Data["url"]; u != "redis://redis.shared:6379" {
		t.Errorf("redis.url: the ConfigMap says %q", u)
	}

	// The chart's dashboard is the file, and its rules with the default
	// values are those of deploy/kubernetes/monitoring.
	dash, err := os.ReadFile(filepath.Join(chart, "dashboards", "quotad.json"))
	if err != nil {
		t.Fatal(err)
	}
	if cm := r.configMaps["quotad-dashboard"]; cm == nil || cm.Data["quotad-dashboard.json"] != string(dash) || cm.Labels["grafana_dashboard"] != "1" {
		t.Error("the chart's dashboard ConfigMap does not hold dashboards/quotad.json with the label grafana_dashboard")
	}
	mon := kustomize(t, filepath.Join(dir, "monitoring"))
	if !reflect.DeepEqual(r.rules["quotad"].Spec, mon.rules["quotad"].Spec) {
		a, _ := yaml.Marshal(r.rules["quotad"].Spec)
		b, _ := yaml.Marshal(mon.rules["quotad"].Spec)
		t.Errorf("the chart's rules differ from monitoring/prometheusrule.yaml:\nchart:\n%s\nkustomize:\n%s", a, b)
	}
	// Thresholds follow the values.
	custom := helmTemplate(t, "--set", "metrics.prometheusRule.enabled=true,maxConns=5000")
	found := false
	for _, g := range custom.rules["quotad"].Spec.Groups {
		for _, rule := range g.Rules {
			if rule.Alert == "QuotadConnectionsNearLimit" {
				found = strings.HasSuffix(rule.Expr, "> 4000")
			}
		}
	}
	if !found {
		t.Error("maxConns=5000: QuotadConnectionsNearLimit does not fire above 4000")
	}
}

// A chart of a user's own that includes the named templates, as
// deploy/helm/examples/web does, with quotad as its dependency (copied into
// a temporary charts/ as helm dependency update would).
func TestHelmNamedTemplatesInAnotherChart(t *testing.T) {
	helm := tool(t, "helm", helmPkg)
	tmp := t.TempDir()
	web := filepath.Join(tmp, "web")
	if err := os.CopyFS(web, os.DirFS(filepath.Join("helm", "examples", "web"))); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(web, "charts", "quotad"), os.DirFS(filepath.Join("helm", "quotad"))); err != nil {
		t.Fatal(err)
	}
	runTool(t, helm, "lint", "--strict", web)
	out := runTool(t, helm, "template", "web", web, "--kube-version", kubeVersion)
	r := decodeAll(t, "helm template examples/web", out)
	d := r.deployments["web"]
	if d == nil {
		t.Fatalf("no Deployment web: %v", r.deployments)
	}
	q := checkSidecarPod(t, "examples/web", &d.Spec.Template.Spec, r)
	checkDoctor(t, "examples/web", q, r)
	checkSelects(t, "examples/web", d, q, r)
	runSidecar(t, "examples/web", &d.Spec.Template.Spec, q, r)
	if q.Image != "registry.example.com/quotad:v1.2.3" || r.configMaps["web-quotad-redis"].Data["url"] != "redis://redis.shared.svc.cluster.local:6379" {
		t.Errorf("the templates did not read the quotad values of the parent chart: image %s, redis %v", q.Image, r.configMaps["web-quotad-redis"].Data)
	}
	if len(r.pdbs) != 1 || len(r.podMonitors) != 1 || len(r.rules) != 1 {
		t.Errorf("want the PDB, PodMonitor and rules the values enable: %d %d %d", len(r.pdbs), len(r.podMonitors), len(r.rules))
	}
}

// The Makefile's test-deps installs the versions the tests use.
func TestMakefileInstallsTheRenderers(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{helmPkg, kustomizePkg} {
		if !bytes.Contains(mk, []byte(pkg)) {
			t.Errorf("the Makefile does not install %s", pkg)
		}
	}
}

// queries are every PromQL expression of the dashboard and the alert rules.
func queries(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	data, err := os.ReadFile(filepath.Join(dir, "monitoring", "quotad-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			out[fmt.Sprintf("dashboard panel %q query %d", p.Title, i)] = tg.Expr
		}
	}
	for _, v := range dash.Templating.List {
		q, ok := v.Query.(map[string]any)
		if !ok {
			continue
		}
		s, _ := q["query"].(string)
		m := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`).FindStringSubmatch(s)
		if m == nil {
			t.Errorf("dashboard variable %s: query %q is not label_values(<selector>, <label>)", v.Name, s)
			continue
		}
		out["dashboard variable "+v.Name] = m[1]
	}
	data, err = os.ReadFile(filepath.Join(dir, "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule prometheusRule
	if err := yaml.UnmarshalStrict(data, &rule); err != nil {
		t.Fatal(err)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d queries", len(out))
	}
	return out
}

// kubeStateMetrics are the series the doctor alert reads from
// kube-state-metrics, not from quotad.
var kubeStateMetrics = map[string][]string{
	"kube_job_status_failed": {"job_name", "reason"},
	"kube_job_created":       {"job_name"},
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"namespace", "pod", "job", "instance", "container", "endpoint"}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}
)

// metricRefs returns the metric names an expression reads, each with the
// label names its selector matches on. It is a tokenizer, not a parser:
// enough for the expressions of this repository.
func metricRefs(expr string) (map[string][]string, error) {
	e := promString.ReplaceAllString(expr, `""`)
	for _, pair := range []string{"()", "{}", "[]"} {
		if strings.Count(e, pair[:1]) != strings.Count(e, pair[1:]) {
			return nil, fmt.Errorf("unbalanced %s", pair)
		}
	}
	refs := map[string][]string{}
	e = promSelector.ReplaceAllStringFunc(e, func(s string) string {
		m := promSelector.FindStringSubmatch(s)
		var labels []string
		for _, matcher := range strings.Split(m[2], ",") {
			if l := strings.TrimSpace(regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)`).FindString(matcher)); l != "" {
				labels = append(labels, regexp.MustCompile(`[=!~]+$`).ReplaceAllString(l, ""))
			}
		}
		if m[1] == "" {
			return " "
		}
		refs[m[1]] = append(refs[m[1]], labels...)
		return " " + m[1] + " "
	})
	e = promRange.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		name := e[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(e[loc[0]-1:loc[0]], "0123456789.$") {
			continue // part of a number or a variable
		}
		if strings.HasPrefix(strings.TrimLeft(e[loc[1]:], " \t\n"), "(") || slices.Contains(promKeywords, strings.ToLower(name)) {
			continue // a function call, or a keyword
		}
		if _, ok := refs[name]; !ok {
			refs[name] = nil
		}
	}
	return refs, nil
}

func TestMetricRefs(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want map[string][]string
	}{
		{`quotad_redis_up == 0`, map[string][]string{"quotad_redis_up": nil}},
		{`sum by (namespace, pod) (rate(quotad_decisions_total{result="UNAVAILABLE", pod=~"$pod"}[5m])) / 2 > 0.01`, map[string][]string{"quotad_decisions_total": {"result", "pod"}}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket{a="}"}[$__rate_interval]))) and on (job) y offset 5m`, map[string][]string{"x_bucket": {"a"}, "y": nil}},
		{`(kube_job_status_failed{job_name=~"d-.*"} > 0) and on (namespace, job_name) (time() - kube_job_created < 7200)`, map[string][]string{"kube_job_status_failed": {"job_name"}, "kube_job_created": nil}},
	} {
		got, err := metricRefs(tc.expr)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("metricRefs(%s) = %v, %v; want %v", tc.expr, got, err, tc.want)
		}
	}
	if _, err := metricRefs(`sum(rate(x[5m])`); err == nil {
		t.Error("an unbalanced expression was accepted")
	}
}

// exposition parses Prometheus text format: every series name a scrape
// exports (histograms as _bucket, _sum and _count) with its label names.
func exposition(t *testing.T, body string) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	add := func(name string, labels ...string) {
		if out[name] == nil {
			out[name] = map[string]bool{}
		}
		for _, l := range labels {
			out[name][l] = true
		}
	}
	sample := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? `)
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)
	for _, line := range strings.Split(body, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			add(f[2])
			if f[3] == "histogram" {
				add(f[2]+"_bucket", "le")
				add(f[2] + "_sum")
				add(f[2] + "_count")
			}
			continue
		}
		m := sample.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var ls []string
		for _, l := range label.FindAllStringSubmatch(m[3], -1) {
			ls = append(ls, l[1])
		}
		add(m[1], ls...)
	}
	return out
}

// checkQueries fails for every query naming a metric, or a label of it,
// that the scraped sidecar does not export.
func checkQueries(t *testing.T, metrics map[string]map[string]bool) {
	t.Helper()
	var names []string
	for n := range metrics {
		names = append(names, n)
	}
	sort.Strings(names)
	for where, expr := range queries(t) {
		refs, err := metricRefs(expr)
		if err != nil {
			t.Errorf("%s: %s: %v", where, expr, err)
			continue
		}
		if len(refs) == 0 {
			t.Errorf("%s: %s names no metric", where, expr)
		}
		for name, labels := range refs {
			known, fromKSM := kubeStateMetrics[name]
			exported := metrics[name]
			if exported == nil && !fromKSM {
				t.Errorf("%s: %s is not exported by quotad's /metrics (it has %v)", where, name, names)
				continue
			}
			for _, l := range labels {
				if !exported[l] && !slices.Contains(known, l) && !slices.Contains(targetLabels, l) {
					t.Errorf("%s: %s has no label %q", where, name, l)
				}
			}
		}
	}
}

// podVars are the downward API's fields of a pod the tests run.
var podVars = map[string]string{
	"status.podIP": "127.0.0.1", "metadata.name": "quotad-example-7c9f", "metadata.namespace": "shop",
	"metadata.uid": "0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6", "spec.nodeName": "node-1",
}

// renderTraceParent is the trace context of runSidecar's take.
const (
	renderTraceID     = "5bf92f3577b34da6a3ce929d0e0e4736"
	renderTraceParent = "00-" + renderTraceID + "-00f067aa0ba902b7-01"
)

// runSidecar runs a rendered pod's quotad container as the manifest says
// (volumes as directories, ConfigMaps as files, env resolved) against a
// real Redis: its probes pass, the socket has the mode it asks for, and a
// take of the first policy through the app container's socket path is
// allowed. Then each of also runs, given the map from the manifest's paths
// to the test's. SIGTERM stops it cleanly.
func runSidecar(t *testing.T, where string, spec *corev1.PodSpec, q *corev1.Container, r *rendered, also ...func(path func(string) string)) {
	t.Helper()
	redis := redistest.Start(t)
	root, err := os.MkdirTemp("", "qr") // short: a socket path holds 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	p := &pod{root: root, mounts: map[string]string{}, vars: podVars, configMaps: r.configMaps}
	for _, v := range spec.Volumes {
		local := filepath.Join(root, v.Name)
		if err := os.MkdirAll(local, 0o755); err != nil {
			t.Fatal(err)
		}
		if v.ConfigMap != nil {
			for k, data := range r.configMaps[v.ConfigMap.Name].Data {
				if err := os.WriteFile(filepath.Join(local, k), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		if m := mount(q, v.Name); m != nil {
			p.mounts[m.MountPath] = local
		}
	}
	httpAddr := freeAddr(t)
	var log bytes.Buffer
	serve := exec.Command(quotadBin, q.Args...)
	serve.Env = p.environ(t, q, map[string]string{"QUOTAD_REDIS_URL": redis.URL(), "QUOTAD_HTTP_ADDR": httpAddr})
	serve.Stdout, serve.Stderr = &log, &log
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = serve.Wait(); close(exited) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = serve.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s: quotad log:\n%s", where, log.String())
		}
	})

	for _, pr := range []*corev1.Probe{q.StartupProbe, q.ReadinessProbe, q.LivenessProbe} {
		deadline := time.Now().Add(waitTimeout)
		for {
			code, body, err := httpGet("http://" + httpAddr + pr.HTTPGet.Path)
			if err == nil && code >= 200 && code < 400 {
				break
			}
			select {
			case <-exited:
				t.Fatalf("%s: quotad exited (%v) before its probe GET %s passed", where, waitErr, pr.HTTPGet.Path)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: probe GET %s: %d %s %v", where, pr.HTTPGet.Path, code, body, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	sock := p.path(env(q, "QUOTAD_SOCKET").Value)
	st, err := os.Stat(sock)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if m := env(q, "QUOTAD_SOCKET_MODE"); m != nil && fmt.Sprintf("%04o", st.Mode().Perm()) != m.Value {
		t.Errorf("%s: socket mode %04o, want QUOTAD_SOCKET_MODE %s", where, st.Mode().Perm(), m.Value)
	}
	cfg := policies(t, where, spec, q, r)
	names := make([]string, 0, len(cfg.Policies))
	for n := range cfg.Policies {
		names = append(names, n)
	}
	sort.Strings(names)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := protocol.Dial(ctx, sock)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	reply, raw, err := c.Call(ctx, map[string]any{"op": "take", "subject": sharedSubject, "policy": names[0], "traceparent": renderTraceParent})
	c.Close()
	if err != nil || !reply.OK || !reply.Allowed || reply.Used != 1 {
		t.Fatalf("%s: take of policy %s: %s %v; want allowed, used 1", where, names[0], raw, err)
	}
	for _, f := range also {
		f(p.path)
	}

	if err := serve.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped = true
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("%s: quotad after SIGTERM: %v", where, waitErr)
		}
	case <-time.After(waitTimeout):
		_ = serve.Process.Kill()
		<-exited
		t.Fatalf("%s: quotad did not stop after SIGTERM", where)
	}
}

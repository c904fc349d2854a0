// Package deploy_test checks the Kubernetes example in deploy/kubernetes:
// every manifest decodes strictly into the Kubernetes API types, the
// cross-references between them hold, and the sidecar and app containers,
// run as the manifests say (paths mapped to a temporary directory), work
// together against a real Redis. render_test.go renders the Component,
// its example overlay, the monitoring kustomization and the Helm chart.
package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"quotad/integration/redistest"
	"quotad/policy"
)

const dir = "kubernetes"

// waitTimeout bounds every wait; it decides how long a broken test takes to
// fail, never whether a working one passes.
const waitTimeout = 30 * time.Second

var quotadBin string

func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "quotad-deploy")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	quotadBin = filepath.Join(tmp, "quotad")
	build := exec.Command("go", "build", "-o", quotadBin, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build quotad: %v\n%s", err, out)
		os.RemoveAll(tmp)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmp)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// kustomization is the part of kustomize's Kustomization this example uses;
// an unknown field fails the strict decode like a typo would.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Labels     []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
	Resources          []string `json:"resources"`
	ConfigMapGenerator []struct {
		Name  string   `json:"name"`
		Files []string `json:"files"`
	} `json:"configMapGenerator"`
	Images []image `json:"images"`
}

type image struct {
	Name    string `json:"name"`
	NewName string `json:"newName"`
	NewTag  string `json:"newTag"`
}

// example is the decoded example: its Deployment and the ConfigMaps and
// Secrets it may reference, by name.
type example struct {
	kust       kustomization
	deployment *appsv1.Deployment
	doctor     *batchv1.CronJob
	pdb        *policyv1.PodDisruptionBudget
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
}

func strict(t *testing.T, path string, data []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// load decodes every file of the example strictly.
func load(t *testing.T) *example {
	t.Helper()
	ex := &example{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	strict(t, "kustomization.yaml", data, &ex.kust)
	if ex.kust.APIVersion != "kustomize.config.k8s.io/v1beta1" || ex.kust.Kind != "Kustomization" {
		t.Fatalf("kustomization.yaml: %s %s", ex.kust.APIVersion, ex.kust.Kind)
	}
	// The example Secret is decoded and cross-checked too, though not applied.
	files := append(slices.Clone(ex.kust.Resources), "secret.example.yaml")
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatalf("resource %s: %v", f, err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			where := fmt.Sprintf("%s document %d (%s)", f, i, meta.Kind)
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 Deployment":
				if ex.deployment != nil {
					t.Fatalf("%s: a second Deployment", where)
				}
				ex.deployment = &appsv1.Deployment{}
				strict(t, where, []byte(doc), ex.deployment)
			case "batch/v1 CronJob":
				if ex.doctor != nil {
					t.Fatalf("%s: a second CronJob", where)
				}
				ex.doctor = &batchv1.CronJob{}
				strict(t, where, []byte(doc), ex.doctor)
			case "policy/v1 PodDisruptionBudget":
				if ex.pdb != nil {
					t.Fatalf("%s: a second PodDisruptionBudget", where)
				}
				ex.pdb = &policyv1.PodDisruptionBudget{}
				strict(t, where, []byte(doc), ex.pdb)
			case "v1 ConfigMap":
				cm := &corev1.ConfigMap{}
				strict(t, where, []byte(doc), cm)
				ex.configMaps[cm.Name] = cm
			case "v1 Secret":
				s := &corev1.Secret{}
				strict(t, where, []byte(doc), s)
				ex.secrets[s.Name] = s
			default:
				t.Fatalf("%s: unexpected %s %s", where, meta.APIVersion, meta.Kind)
			}
		}
	}
	for _, g := range ex.kust.ConfigMapGenerator {
		cm := &corev1.ConfigMap{Data: map[string]string{}}
		cm.Name = g.Name
		for _, f := range g.Files {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Fatalf("configMapGenerator %s: %v", g.Name, err)
			}
			cm.Data[filepath.Base(f)] = string(b)
		}
		ex.configMaps[g.Name] = cm
	}
	if ex.deployment == nil || ex.doctor == nil || ex.pdb == nil {
		t.Fatal("want a Deployment, a CronJob and a PodDisruptionBudget among the resources")
	}
	return ex
}

func env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func mount(c *corev1.Container, volume string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == volume {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

// containers returns the quotad sidecar and the app container.
func containers(t *testing.T, spec *corev1.PodSpec) (quotad, app *corev1.Container) {
	t.Helper()
	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("want one init container (quotad) and one container (app), got %d and %d", len(spec.InitContainers), len(spec.Containers))
	}
	return &spec.InitContainers[0], &spec.Containers[0]
}

// dockerEntrypoint is the binary's path in the image, from deploy/Dockerfile.
func dockerEntrypoint(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)
	for _, want := range []string{"CGO_ENABLED=0", "FROM scratch", "USER 65532:65532"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q (static binary, minimal image, non-root)", want)
		}
	}
	m := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]`).FindStringSubmatch(df)
	if m == nil {
		t.Fatal("Dockerfile: no exec-form ENTRYPOINT")
	}
	return m[1]
}

func TestManifestsDecodeStrictlyAndAgree(t *testing.T) {
	ex := load(t)
	spec := &ex.deployment.Spec.Template.Spec
	quotad, app := containers(t, spec)
	dockerEntrypoint(t)

	if sel := ex.deployment.Spec.Selector; sel == nil || !mapsSubset(sel.MatchLabels, ex.deployment.Spec.Template.Labels) {
		t.Errorf("the selector %v does not match the pod labels %v", sel, ex.deployment.Spec.Template.Labels)
	}

	// A native sidecar.
	if quotad.Name != "quotad" || quotad.RestartPolicy == nil || *quotad.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("init container %q: want quotad with restartPolicy Always", quotad.Name)
	}
	if !slices.ContainsFunc(ex.kust.Images, func(i image) bool { return i.Name == quotad.Image }) {
		t.Errorf("image %q of quotad is not set by the kustomization's images", quotad.Image)
	}

	// Every mount names a volume, every configMap volume a ConfigMap.
	volumes := map[string]*corev1.Volume{}
	for i := range spec.Volumes {
		volumes[spec.Volumes[i].Name] = &spec.Volumes[i]
	}
	doctor := doctorContainer(t, ex)
	for _, c := range []*corev1.Container{quotad, app, doctor} {
		for _, m := range c.VolumeMounts {
			if volumes[m.Name] == nil {
				t.Errorf("container %s mounts volume %q, which the pod does not have", c.Name, m.Name)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				ref := e.ValueFrom.ConfigMapKeyRef
				if cm := ex.configMaps[ref.Name]; cm == nil {
					t.Errorf("%s: %s reads ConfigMap %q, which is not a resource", c.Name, e.Name, ref.Name)
				} else if _, ok := cm.Data[ref.Key]; !ok {
					t.Errorf("%s: %s reads key %q of ConfigMap %s, which has no such key", c.Name, e.Name, ref.Key, ref.Name)
				}
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				ref := e.ValueFrom.SecretKeyRef
				if s := ex.secrets[ref.Name]; s == nil {
					t.Errorf("%s: %s reads Secret %q, which secret.example.yaml does not define", c.Name, e.Name, ref.Name)
				} else if _, ok := s.StringData[ref.Key]; !ok {
					t.Errorf("%s: %s reads key %q of Secret %s, which has no such key", c.Name, e.Name, ref.Key, ref.Name)
				}
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && ex.configMaps[v.ConfigMap.Name] == nil {
			t.Errorf("volume %s: ConfigMap %q is neither a resource nor generated", v.Name, v.ConfigMap.Name)
		}
	}

	// The config flag points at a key of the mounted ConfigMap, whose
	// policies the sidecar accepts.
	cfgEnv := env(quotad, "QUOTAD_CONFIG")
	if cfgEnv == nil {
		t.Fatal("quotad has no QUOTAD_CONFIG")
	}
	found := false
	for _, m := range quotad.VolumeMounts {
		v := volumes[m.Name]
		if v == nil || v.ConfigMap == nil || filepath.Dir(cfgEnv.Value) != m.MountPath {
			continue
		}
		found = true
		cm := ex.configMaps[v.ConfigMap.Name]
		key := filepath.Base(cfgEnv.Value)
		if cm == nil || cm.Data[key] == "" {
			t.Fatalf("QUOTAD_CONFIG %s: ConfigMap %s has no key %q", cfgEnv.Value, v.ConfigMap.Name, key)
		}
		if _, err := policy.ParseConfig([]byte(cm.Data[key])); err != nil {
			t.Errorf("ConfigMap %s key %s: %v", cm.Name, key, err)
		}
	}
	if !found {
		t.Errorf("QUOTAD_CONFIG %s is not in a mounted ConfigMap", cfgEnv.Value)
	}

	// App and sidecar agree on the socket, on a shared emptyDir.
	sock := env(quotad, "QUOTAD_SOCKET")
	appSock := env(app, "QUOTAD_SOCKET")
	if sock == nil || appSock == nil || sock.Value != appSock.Value {
		t.Fatalf("QUOTAD_SOCKET: quotad %v, app %v; want the same path", sock, appSock)
	}
	var shared string
	for _, m := range quotad.VolumeMounts {
		if m.MountPath == filepath.Dir(sock.Value) {
			shared = m.Name
		}
	}
	if v := volumes[shared]; v == nil || v.EmptyDir == nil {
		t.Fatalf("the socket's directory %s is not an emptyDir mounted by quotad", filepath.Dir(sock.Value))
	}
	if m := mount(app, shared); m == nil || m.MountPath != filepath.Dir(sock.Value) {
		t.Fatalf("app does not mount volume %s at %s", shared, filepath.Dir(sock.Value))
	}

	// HTTP probes on the sidecar's port; that they pass, and that readiness
	// holds while Redis is down, is run below.
	checkProbes(t, "deployment.yaml", quotad)
	if ex.pdb.Spec.Selector == nil || !mapsSubset(ex.pdb.Spec.Selector.MatchLabels, ex.deployment.Spec.Template.Labels) {
		t.Errorf("the PodDisruptionBudget's selector %v does not match the pods", ex.pdb.Spec.Selector)
	}
	// Restrictive security for every container, and resources sized.
	for _, psc := range []*corev1.PodSecurityContext{spec.SecurityContext, ex.doctor.Spec.JobTemplate.Spec.Template.Spec.SecurityContext} {
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
			t.Error("every pod must run as non-root")
		}
	}
	for _, c := range []*corev1.Container{quotad, app, doctor} {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container %s: want a read-only root, no privilege escalation, every capability dropped", c.Name)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; !ok {
				t.Errorf("container %s: no %s request", c.Name, r)
			}
			if _, ok := c.Resources.Limits[r]; !ok {
				t.Errorf("container %s: no %s limit", c.Name, r)
			}
		}
	}

	// The doctor looks at the sidecars' Redis and keys, with their image,
	// read from the same ConfigMap.
	for _, name := range []string{"QUOTAD_REDIS_URL", "QUOTAD_KEY_PREFIX", "QUOTAD_REDIS_PASSWORD"} {
		a, b := env(quotad, name), env(doctor, name)
		if a == nil || !reflect.DeepEqual(a, b) {
			t.Errorf("%s: sidecar %+v, doctor %+v; want the same", name, a, b)
		}
		if name != "QUOTAD_REDIS_PASSWORD" && (a == nil || a.ValueFrom == nil || a.ValueFrom.ConfigMapKeyRef == nil) {
			t.Errorf("%s is not read from a ConfigMap: %+v", name, a)
		}
	}
	if doctor.Image != quotad.Image || len(doctor.Args) == 0 || doctor.Args[0] != "doctor" {
		t.Errorf("doctor: image %s args %v; want the sidecar's image running doctor", doctor.Image, doctor.Args)
	}

	// The app's client is the tested package, verbatim: the package is one
	// file, shipped as the module quotad.py.
	shipped, err := os.ReadFile(filepath.Join(dir, "app", "quotad.py"))
	if err != nil {
		t.Fatal(err)
	}
	tested, err := os.ReadFile(filepath.Join("..", "clients", "python", "src", "quotad", "__init__.py"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shipped, tested) {
		t.Error("deploy/kubernetes/app/quotad.py differs from clients/python/src/quotad/__init__.py: copy it again")
	}
}

func doctorContainer(t *testing.T, ex *example) *corev1.Container {
	t.Helper()
	cs := ex.doctor.Spec.JobTemplate.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("the doctor CronJob has %d containers, want 1", len(cs))
	}
	return &cs[0]
}

func mapsSubset(sub, of map[string]string) bool {
	for k, v := range sub {
		if of[k] != v {
			return false
		}
	}
	return len(sub) > 0
}

// pod runs the example's containers as processes: absolute paths the
// manifests use are mapped under root, volumes become directories.
type pod struct {
	root       string
	mounts     map[string]string // mountPath in the manifests -> directory here
	vars       map[string]string // values of fieldRef and overridden variables
	configMaps map[string]*corev1.ConfigMap
}

// path maps a manifest path under a known mount to its directory here.
func (p *pod) path(s string) string {
	for mp, local := range p.mounts {
		if s == mp || strings.HasPrefix(s, mp+"/") {
			return local + strings.TrimPrefix(s, mp)
		}
	}
	return s
}

// environ is the container's environment as the kubelet would build it,
// with paths mapped and the test's overrides applied.
func (p *pod) environ(t *testing.T, c *corev1.Container, override map[string]string) []string {
	t.Helper()
	out := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + p.root}
	seen := map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case override[e.Name] != "":
			v = override[e.Name]
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v = p.vars[e.ValueFrom.FieldRef.FieldPath]
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := p.configMaps[ref.Name]
			if cm == nil {
				t.Fatalf("%s: ConfigMap %s of %s is not in the example", c.Name, ref.Name, e.Name)
			}
			v = cm.Data[ref.Key]
		case e.ValueFrom != nil:
			continue // secrets: see the caller
		}
		v = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(v, func(m string) string {
			return seen[m[2:len(m)-1]]
		})
		v = p.path(v)
		seen[e.Name] = v
		out = append(out, e.Name+"="+v)
	}
	return out
}

// httpGet is one GET with a short timeout.
func httpGet(url string) (int, string, error) {
	// No keep-alive: no idle connection outlives the test for goleak.
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The sidecar started as the manifest says, its three HTTP probes, the
// Python app talking to it through the shared socket, the doctor, the
// metrics the dashboard and alerts read, and readiness with Redis stopped.
func TestExampleRunsAsWritten(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 is needed to run the example app (make test-deps installs it)")
	}
	ex := load(t)
	spec := &ex.deployment.Spec.Template.Spec
	quotad, app := containers(t, spec)
	r := redistest.Start(t)

	root, err := os.MkdirTemp("", "qk") // short: a socket path holds 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	p := &pod{root: root, mounts: map[string]string{}, vars: podVars, configMaps: ex.configMaps}
	for _, v := range spec.Volumes {
		local := filepath.Join(root, v.Name)
		if err := os.MkdirAll(local, 0o755); err != nil {
			t.Fatal(err)
		}
		if v.ConfigMap != nil {
			for k, data := range ex.configMaps[v.ConfigMap.Name].Data {
				if err := os.WriteFile(filepath.Join(local, k), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, c := range []*corev1.Container{quotad, app} {
			if m := mount(c, v.Name); m != nil {
				p.mounts[m.MountPath] = local
			}
		}
	}

	// The test's Redis has no password: QUOTAD_REDIS_PASSWORD (from the
	// Secret) is left out, and the URL points at it.
	httpAddr := freeAddr(t)
	sidecarEnv := p.environ(t, quotad, map[string]string{"QUOTAD_REDIS_URL": r.URL(), "QUOTAD_HTTP_ADDR": httpAddr})
	var log bytes.Buffer
	serve := exec.Command(quotadBin, quotad.Args...)
	serve.Env = sidecarEnv
	serve.Stdout, serve.Stderr = &log, &log
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = serve.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("quotad log:\n%s", log.String())
		}
	})

	// A probe is a GET on QUOTAD_HTTP_ADDR (the test's address for the pod
	// IP's): 2xx or 3xx passes, as for the kubelet.
	probe := func(name string, pr *corev1.Probe) error {
		code, body, err := httpGet("http://" + httpAddr + pr.HTTPGet.Path)
		if err != nil {
			return fmt.Errorf("%s probe GET %s: %v", name, pr.HTTPGet.Path, err)
		}
		if code < 200 || code >= 400 {
			return fmt.Errorf("%s probe GET %s: %d %s", name, pr.HTTPGet.Path, code, body)
		}
		return nil
	}
	// The startup probe gates the app, as the kubelet does; then every
	// probe must pass on a healthy pod.
	deadline := time.Now().Add(waitTimeout)
	for {
		err := probe("startup", quotad.StartupProbe)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	deadline = time.Now().Add(waitTimeout)
	for {
		err := probe("readiness", quotad.ReadinessProbe)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := probe("liveness", quotad.LivenessProbe); err != nil {
		t.Fatal(err)
	}

	appArgs := make([]string, 0, len(app.Command)+len(app.Args))
	for _, a := range append(slices.Clone(app.Command), app.Args...) {
		appArgs = append(appArgs, p.path(a))
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	run := exec.CommandContext(ctx, appArgs[0], appArgs[1:]...)
	run.Env = append(p.environ(t, app, nil), "QUOTAD_APP_JOBS=3", "QUOTAD_APP_PAUSE_S=0", "QUOTAD_APP_SUBJECT=deploy-test")
	out, err := run.CombinedOutput()
	if err != nil || strings.Count(string(out), `"event":"job done"`) != 3 {
		t.Fatalf("app: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"used":3,"limit":100`) {
		t.Fatalf("app output does not show the api policy of the ConfigMap counting its jobs:\n%s", out)
	}

	// The doctor CronJob's command, on the same Redis: every key the app's
	// takes wrote is healthy.
	doctor := doctorContainer(t, ex)
	dctx, dcancel := context.WithTimeout(context.Background(), waitTimeout)
	defer dcancel()
	dcmd := exec.CommandContext(dctx, quotadBin, doctor.Args...)
	dcmd.Env = p.environ(t, doctor, map[string]string{"QUOTAD_REDIS_URL": r.URL()})
	if out, err := dcmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "no problems found") || !regexp.MustCompile(`fixed_window\s+api\s+1\n`).Match(out) {
		t.Fatalf("doctor %v: %v\n%s", doctor.Args, err, out)
	}

	// Every metric the dashboard and the alerts name is exported by this
	// sidecar, which has answered the app's takes.
	code, body, err := httpGet("http://" + httpAddr + "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	checkQueries(t, exposition(t, body))

	// Redis down: the pod stays ready (its Service keeps it, and the
	// policies' on_unavailable decides), while /redisz says Redis is not.
	if code, body, err := httpGet("http://" + httpAddr + "/redisz"); err != nil || code != 200 {
		t.Fatalf("/redisz with redis up: %d %s %v", code, body, err)
	}
	r.Stop(t)
	deadline = time.Now().Add(waitTimeout)
	for {
		code, body, err := httpGet("http://" + httpAddr + "/redisz")
		if err == nil && code == 503 && strings.Contains(body, "redis is not answering") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/redisz with redis stopped: %d %s %v; want 503 and why", code, body, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for name, pr := range map[string]*corev1.Probe{"startup": quotad.StartupProbe, "readiness": quotad.ReadinessProbe, "liveness": quotad.LivenessProbe} {
		if err := probe(name, pr); err != nil {
			t.Errorf("with redis stopped: %v", err)
		}
	}

	if err := serve.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped = true
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("quotad after SIGTERM: %v", err)
		}
	case <-time.After(waitTimeout):
		_ = serve.Process.Kill()
		<-exited
		t.Fatal("quotad did not stop after SIGTERM")
	}
}

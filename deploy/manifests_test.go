package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/mcpgate/mcpgate/policy"
)

// dockerInstr is one instruction of a Dockerfile.
type dockerInstr struct{ op, args string }

// parseDockerfile reads the instructions (comments dropped, continuations
// joined) grouped by stage.
func parseDockerfile(t *testing.T, path string) [][]dockerInstr {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		stages [][]dockerInstr
		line   string
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasSuffix(l, `\`) {
			line += strings.TrimSuffix(l, `\`) + " "
			continue
		}
		line += l
		op, args, _ := strings.Cut(line, " ")
		line = ""
		in := dockerInstr{strings.ToUpper(op), strings.TrimSpace(args)}
		if in.op == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("%s: %s before the first FROM", path, in.op)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	return stages
}

func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, "Dockerfile")
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a multi-stage build", len(stages))
	}
	var built bool
	for _, st := range stages[:len(stages)-1] {
		for _, in := range st {
			if in.op == "RUN" && strings.Contains(in.args, "go build") {
				built = strings.Contains(in.args, "CGO_ENABLED=0") && strings.Contains(in.args, "./cmd/mcpgate")
			}
		}
	}
	if !built {
		t.Error("no build stage runs CGO_ENABLED=0 go build ./cmd/mcpgate (a static binary)")
	}
	final := map[string][]string{}
	for _, in := range stages[len(stages)-1] {
		final[in.op] = append(final[in.op], in.args)
	}
	base := final["FROM"][0]
	if !strings.HasPrefix(base, "gcr.io/distroless/static") {
		t.Errorf("final stage FROM %s, want distroless/static (CA certificates, no shell)", base)
	}
	users := final["USER"]
	if len(users) == 0 {
		t.Error("final stage sets no USER: the container would run as root")
	} else if u, _, _ := strings.Cut(users[len(users)-1], ":"); u == "root" || u == "0" || strings.Trim(u, "0123456789") != "" {
		t.Errorf("USER %s: want a numeric non-root uid (runAsNonRoot can check only a number)", users[len(users)-1])
	}
	for op, want := range map[string]string{
		"ENTRYPOINT": `["mcpgate"]`,
		"CMD":        `["serve", "--config", "/etc/mcpgate/mcpgate.yaml"]`,
		"EXPOSE":     "8080",
	} {
		if got := final[op]; len(got) != 1 || got[0] != want {
			t.Errorf("final stage %s %q, want %s", op, got, want)
		}
	}
	if cp := strings.Join(final["COPY"], "\n"); !strings.Contains(cp, "--from=build") || !strings.Contains(cp, "/usr/local/bin/mcpgate") {
		t.Errorf("final stage COPY %q: want the binary from the build stage in /usr/local/bin", cp)
	}
}

// manifest is the part of a Kubernetes object the tests read.
type manifest struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name        string            `yaml:"name"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec yaml.Node         `yaml:"spec"`
	// ServiceAccount
	AutomountServiceAccountToken *bool `yaml:"automountServiceAccountToken"`
	// Kustomization
	Resources []string `yaml:"resources"`
	file      string
}

func readManifests(t *testing.T) map[string]manifest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	out := map[string]manifest{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(false)
		for {
			var m manifest
			if err := dec.Decode(&m); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if _, dup := out[m.Kind]; dup {
				t.Fatalf("%s: a second %s", f, m.Kind)
			}
			m.file = filepath.Base(f)
			out[m.Kind] = m
		}
	}
	return out
}

// Objects of the Deployment's spec the tests check.
type (
	probe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
	}
	envVar struct {
		Name      string `yaml:"name"`
		ValueFrom struct {
			SecretKeyRef struct{ Name, Key string } `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	}
	container struct {
		Args  []string `yaml:"args"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		Env             []envVar `yaml:"env"`
		ReadinessProbe  *probe   `yaml:"readinessProbe"`
		LivenessProbe   *probe   `yaml:"livenessProbe"`
		Resources       struct{ Requests, Limits map[string]string }
		SecurityContext struct {
			RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
			ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
			AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		} `yaml:"securityContext"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
	}
	deploymentSpec struct {
		Replicas int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				ServiceAccountName           string `yaml:"serviceAccountName"`
				AutomountServiceAccountToken *bool  `yaml:"automountServiceAccountToken"`
				SecurityContext              struct {
					RunAsNonRoot *bool `yaml:"runAsNonRoot"`
					RunAsUser    int   `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
				Volumes    []struct {
					Name      string `yaml:"name"`
					ConfigMap *struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	}
)

func decodeSpec[T any](t *testing.T, m manifest) T {
	t.Helper()
	var v T
	if err := m.Spec.Decode(&v); err != nil {
		t.Fatalf("%s spec: %v", m.Kind, err)
	}
	return v
}

// selects reports whether every label of selector is in labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

func TestKubernetesManifests(t *testing.T) {
	ms := readManifests(t)
	for _, kind := range []string{"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceAccount", "Kustomization"} {
		if _, ok := ms[kind]; !ok {
			t.Fatalf("no %s among the manifests (have %v)", kind, keys(ms))
		}
	}
	d := decodeSpec[deploymentSpec](t, ms["Deployment"])
	pod := d.Template.Spec
	if d.Replicas < 2 {
		t.Errorf("replicas %d, want at least 2", d.Replicas)
	}
	if !selects(d.Selector.MatchLabels, d.Template.Metadata.Labels) {
		t.Errorf("Deployment selector %v does not select its pods %v", d.Selector.MatchLabels, d.Template.Metadata.Labels)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 8080 {
		t.Fatalf("container ports %+v, want one port 8080", c.Ports)
	}
	port := c.Ports[0].Name
	for name, p := range map[string]struct {
		probe *probe
		path  string
	}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port != port {
			t.Errorf("%s probe %+v, want GET %s on port %q", name, p.probe, p.path, port)
		}
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	sc := c.SecurityContext
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || !sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container securityContext %+v: want runAsNonRoot, readOnlyRootFilesystem, no privilege escalation", sc)
	}
	if p := pod.SecurityContext; p.RunAsNonRoot == nil || !*p.RunAsNonRoot || p.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", p)
	}

	// The pods run as the ServiceAccount that carries the IAM role for the
	// DynamoDB usage store (IRSA), without a Kubernetes API token: the
	// gateway never calls the API, and IRSA's webhook projects a token of
	// its own for AWS.
	sa := ms["ServiceAccount"]
	if pod.ServiceAccountName == "" || pod.ServiceAccountName != sa.Metadata.Name {
		t.Errorf("Deployment serviceAccountName %q, want the ServiceAccount %q", pod.ServiceAccountName, sa.Metadata.Name)
	}
	if a := pod.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("pod automountServiceAccountToken %s, want false (the gateway does not use the Kubernetes API)", optBool(a))
	}
	if a := sa.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("ServiceAccount automountServiceAccountToken %s, want false", optBool(a))
	}
	if !selects(sa.Metadata.Labels, d.Template.Metadata.Labels) {
		t.Errorf("ServiceAccount labels %v, want the Deployment's pod labels %v", sa.Metadata.Labels, d.Template.Metadata.Labels)
	}
	if arn := sa.Metadata.Annotations["eks.amazonaws.com/role-arn"]; !iamRoleARN.MatchString(arn) {
		t.Errorf("ServiceAccount annotation eks.amazonaws.com/role-arn %q: want an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME) to replace", arn)
	}
	secrets := map[string]bool{}
	for _, e := range c.Env {
		if e.ValueFrom.SecretKeyRef.Name != "" {
			secrets[e.Name] = true
		}
	}
	for _, name := range []string{"MCPGATE_JWT_SECRET", "MCPGATE_ADMIN_TOKEN", "MCPGATE_SESSION_KEY"} {
		if !secrets[name] {
			t.Errorf("env %s does not come from a Secret", name)
		}
	}
	if !slices.Equal(c.Args, []string{"serve", "--config", "/etc/mcpgate/mcpgate.yaml"}) {
		t.Errorf("args %q", c.Args)
	}

	// The config: mounted from the ConfigMap at the path the args name.
	cm := ms["ConfigMap"]
	var mounted string
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name {
			for _, vm := range c.VolumeMounts {
				if vm.Name == v.Name {
					mounted = vm.MountPath
				}
			}
		}
	}
	if mounted != "/etc/mcpgate" {
		t.Errorf("ConfigMap %s mounted at %q, want /etc/mcpgate", cm.Metadata.Name, mounted)
	}
	cfg := configMapConfig(t, cm)
	if cfg.Listen != "0.0.0.0:8080" {
		t.Errorf("listen %q, want 0.0.0.0:8080 (the container port, on every interface)", cfg.Listen)
	}
	if len(cfg.Store.Redis) == 0 || len(cfg.Cache.Redis) == 0 {
		t.Errorf("store.redis %q, cache.redis %q: replicas must share Redis", cfg.Store.Redis, cfg.Cache.Redis)
	}
	if !secrets[cfg.Auth.SessionSecretEnv] || !secrets[cfg.Auth.JWT.HS256SecretEnv] || !secrets[cfg.Auth.AdminTokenEnv] {
		t.Errorf("the config reads %s, %s, %s: each must come from the Secret", cfg.Auth.JWT.HS256SecretEnv, cfg.Auth.AdminTokenEnv, cfg.Auth.SessionSecretEnv)
	}
	if !strings.HasPrefix(cfg.Usage.Store, "dynamodb:") {
		t.Errorf("usage.store %q: replicas need a shared usage store", cfg.Usage.Store)
	}

	svcSel := decodeSpec[struct {
		Selector map[string]string `yaml:"selector"`
	}](t, ms["Service"]).Selector
	pdbSel := decodeSpec[struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
	}](t, ms["PodDisruptionBudget"]).Selector.MatchLabels
	for kind, sel := range map[string]map[string]string{"Service": svcSel, "PodDisruptionBudget": pdbSel} {
		if !selects(sel, d.Template.Metadata.Labels) {
			t.Errorf("%s selector %v does not select the Deployment's pods %v", kind, sel, d.Template.Metadata.Labels)
		}
	}
	svc := decodeSpec[struct {
		Ports []struct {
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	}](t, ms["Service"])
	if len(svc.Ports) != 1 || svc.Ports[0].TargetPort != port {
		t.Errorf("Service ports %+v, want targetPort %q", svc.Ports, port)
	}

	// kubectl apply -k applies what the Kustomization lists: every other
	// manifest, once.
	var want []string
	for kind, m := range ms {
		if kind != "Kustomization" {
			want = append(want, m.file)
		}
	}
	got := slices.Clone(ms["Kustomization"].Resources)
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Kustomization resources %q, want the manifests %q", ms["Kustomization"].Resources, want)
	}
}

func optBool(b *bool) string {
	if b == nil {
		return "unset"
	}
	return strconv.FormatBool(*b)
}

// iamRoleARN matches an IAM role ARN in any AWS partition.
var iamRoleARN = regexp.MustCompile(`^arn:aws[a-z-]*:iam::[0-9]{12}:role/[\w+=,.@/-]+$`)

// configMapConfig parses the ConfigMap's mcpgate.yaml as the gateway would,
// with the Secret's variables set.
func configMapConfig(t *testing.T, cm manifest) *policy.Config {
	t.Helper()
	text, ok := cm.Data["mcpgate.yaml"]
	if !ok {
		t.Fatalf("ConfigMap has no mcpgate.yaml (keys %v)", keys(cm.Data))
	}
	for _, v := range []string{"MCPGATE_JWT_SECRET", "MCPGATE_ADMIN_TOKEN", "MCPGATE_SESSION_KEY"} {
		t.Setenv(v, strings.Repeat("s", 32))
	}
	cfg, err := policy.Parse("configmap.yaml:mcpgate.yaml", []byte(text))
	if err != nil {
		t.Fatalf("the ConfigMap's config does not parse:\n%v", err)
	}
	for _, w := range cfg.Warnings {
		t.Errorf("config warning: %v", w)
	}
	return cfg
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

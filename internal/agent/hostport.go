package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// hostPortSetter is the pipeline's switch for the Pods' HostPort
// frontends (loadbalancer.Tracker).
type hostPortSetter interface{ SetHostPorts(on bool) }

// hostPortCheckInterval is how often --hostport=auto reads the CNI
// configuration again: a CNI installed (or changed) after the agent.
const hostPortCheckInterval = 10 * time.Second

// cniNetwork is the network the container runtime uses from dir: the
// first of its .conf, .conflist and .json files by name, as libcni's
// ConfFiles lists them and containerd and CRI-O pick. It returns that file
// and the plugin types it chains; no file is not an error.
func cniNetwork(dir string) (file string, plugins []string, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	for _, e := range entries { // sorted by name
		switch filepath.Ext(e.Name()) {
		case ".conf", ".conflist", ".json":
		default:
			continue
		}
		if e.IsDir() {
			continue
		}
		file = filepath.Join(dir, e.Name())
		data, err := os.ReadFile(file)
		if err != nil {
			return file, nil, err
		}
		var conf struct {
			Type    string `json:"type"` // a .conf: one plugin
			Plugins []struct {
				Type string `json:"type"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal(data, &conf); err != nil {
			return file, nil, fmt.Errorf("%s: %w", file, err)
		}
		if conf.Type != "" {
			plugins = append(plugins, conf.Type)
		}
		for _, p := range conf.Plugins {
			plugins = append(plugins, p.Type)
		}
		return file, plugins, nil
	}
	return "", nil, nil
}

// hostPortDecision says whether sluice serves the Pods' hostPorts under
// --hostport=mode, and why, as `sluice status` shows it. On auto it is off
// only when the CNI's portmap plugin serves them: an unreadable
// configuration leaves it on (both serving is harmless: the first to
// translate a packet wins and the other no longer matches it; neither
// serving loses the ports).
func hostPortDecision(mode, dir string) (on bool, line string) {
	switch mode {
	case HostPortOff:
		return false, "off (--hostport=false)"
	case HostPortOn:
		return true, "on (--hostport=true)"
	}
	file, plugins, err := cniNetwork(dir)
	switch {
	case err != nil:
		return true, fmt.Sprintf("on: the CNI configuration could not be read (%v); check --cni-conf-dir", err)
	case file == "":
		return true, "on: no CNI network in " + dir + " (--cni-conf-dir), so no portmap plugin"
	case slices.Contains(plugins, "portmap"):
		return false, "off: the CNI's portmap plugin serves them (" + file + "); --hostport=true to serve them in the dataplane"
	}
	return true, fmt.Sprintf("on: the CNI network %s has no portmap plugin (%s)", file, strings.Join(plugins, ", "))
}

// applyHostPort decides whether the Pods' hostPorts are served and hands
// the decision to the pipeline; a change is logged and synced.
func (a *Agent) applyHostPort() {
	set, ok := a.pl.(hostPortSetter)
	if !ok {
		return
	}
	on, line := hostPortDecision(a.cfg.HostPort, a.cfg.CNIConfDir)
	a.mu.Lock()
	changed := line != a.hostPortLine
	first := a.hostPortLine == ""
	a.hostPortLine = line
	a.mu.Unlock()
	if !changed {
		return
	}
	set.SetHostPorts(on)
	if first {
		a.log.Info("hostPort", "serving", on, "why", line)
		return
	}
	a.log.Warn("hostPort serving changed", "serving", on, "why", line)
	a.changed()
}

// watchHostPort reads the CNI configuration again every
// hostPortCheckInterval (--hostport=auto): a CNI installs or changes its
// network while the agent runs.
func (a *Agent) watchHostPort(ctx context.Context) {
	every(ctx, hostPortCheckInterval, a.applyHostPort)
}

func (a *Agent) hostPortStatus() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hostPortLine
}

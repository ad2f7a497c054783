package dnsscale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
)

// Version is sluice-dns-autoscaler's version.
const Version = "0.1.0"

// Run validates cfg and runs the autoscaler until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	slog.SetDefault(log)

	restCfg, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	restCfg.UserAgent = "sluice-dns-autoscaler/" + Version
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	c := NewController(client, &cfg, clock.RealClock{}, log)
	log.Info("starting", "version", Version, "targets", cfg.Target, "configmap", cfg.Namespace+"/"+cfg.ConfigMap,
		"pollPeriodSeconds", cfg.PollPeriodSeconds, "nodelabels", cfg.NodeLabels, "nodetaints", cfg.NodeTaints,
		"dryRun", cfg.DryRun, "leaderElect", cfg.LeaderElect)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srvErr := make(chan error, 1)
	if cfg.ListenAddress != "" {
		ln, err := net.Listen("tcp", cfg.ListenAddress)
		if err != nil {
			return fmt.Errorf("--listen-address=%s: %w", cfg.ListenAddress, err)
		}
		srv := &http.Server{Handler: c.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				srvErr <- fmt.Errorf("serve %s: %w", cfg.ListenAddress, err)
				cancel()
			}
		}()
		defer srv.Close()
	}

	if cfg.LeaderElect {
		err = runElected(ctx, client, &cfg, c, log)
	} else {
		err = c.Run(ctx)
	}
	select {
	case e := <-srvErr:
		return e
	default:
		return err
	}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	return cfg, nil
}

// runElected runs c only while this instance holds the Lease. Losing it
// ends Run with an error, so the pod restarts as a clean candidate, as
// kube-controller-manager does.
func runElected(ctx context.Context, client kubernetes.Interface, cfg *Config, c *Controller, log *slog.Logger) error {
	host, _ := os.Hostname()
	id := host + "_" + uuid.NewString()
	ns := cfg.LeaderElectNamespace
	if ns == "" {
		ns = cfg.Namespace
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, cfg.LeaderElectResourceName,
		client.CoreV1(), client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return fmt.Errorf("lease %s/%s: %w", ns, cfg.LeaderElectResourceName, err)
	}
	c.m.leader.Set(0)
	// A failed Run (--max-sync-failures) ends the election too: le.Run
	// would otherwise keep renewing a lease nobody acts on.
	leCtx, leCancel := context.WithCancel(ctx)
	defer leCancel()
	runErr := make(chan error, 1)
	var lost atomic.Bool
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cfg.LeaderElectLeaseDuration,
		RenewDeadline:   cfg.LeaderElectRenewDeadline,
		RetryPeriod:     cfg.LeaderElectRetryPeriod,
		ReleaseOnCancel: true,
		Name:            cfg.LeaderElectResourceName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("leading", "lease", ns+"/"+cfg.LeaderElectResourceName, "identity", id)
				c.m.leader.Set(1)
				err := c.Run(ctx)
				runErr <- err
				if err != nil {
					leCancel()
				}
			},
			OnStoppedLeading: func() {
				c.m.leader.Set(0)
				if leCtx.Err() == nil {
					lost.Store(true)
				}
			},
			OnNewLeader: func(identity string) {
				if identity != id {
					log.Info("following", "leader", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	le.Run(leCtx)
	if lost.Load() {
		return fmt.Errorf("lost lease %s/%s", ns, cfg.LeaderElectResourceName)
	}
	select {
	case err := <-runErr:
		return err
	default:
		return nil
	}
}

package labcli

import (
	"errors"
	"fmt"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/cli"
	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/spf13/cobra"
)

func labMonitorCommand() *cobra.Command {
	var (
		o      cli.MonitorOptions
		output string
	)
	cmd := &cobra.Command{
		Use:   "monitor",
		Short: "Stream the datapath events of every lab node's agent (sluice monitor, merged)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output=%s: want table or json", output)
			}
			q, err := o.Query()
			if err != nil {
				return err
			}
			l, err := loadLab(cmd)
			if err != nil {
				return err
			}
			defer l.Close()
			clients := map[string]*api.Client{}
			for _, n := range l.Nodes {
				if n.Agent != nil && (o.Node() == "" || o.Node() == n.Name) {
					clients[n.Name] = api.NewClient(n.Agent.Socket)
				}
			}
			if len(clients) == 0 {
				return errors.New("no lab node runs a sluice agent (lab up --dataplane sluice)")
			}
			return cli.StreamEvents(cmd.Context(), cmd.OutOrStdout(), output == "json", clients, q)
		},
	}
	o.AddFlags(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// loadLab loads the running lab named by the command's --prefix.
func loadLab(cmd *cobra.Command) (*lab.Lab, error) {
	prefix, _ := cmd.Flags().GetString("prefix")
	return lab.Load(prefix)
}

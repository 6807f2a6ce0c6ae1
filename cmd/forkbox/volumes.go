package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

func newVolumeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Manage the tenant's volumes (directories that outlive sessions; create --volume NAME:PATH mounts one)",
	}
	var size, from string
	create := &cobra.Command{
		Use:   "create NAME [--size SIZE] [--from VOLUME_SNAPSHOT]",
		Short: "Create a volume with a disk quota (SIZE: MiB, or with a unit: 512M, 10G), empty or a copy of a volume snapshot",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var mb int64
			if from == "" || cmd.Flags().Changed("size") {
				var err error
				if mb, err = parseSizeMB(size); err != nil {
					return err
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var v *client.Volume
			if from != "" {
				v, err = c.CreateVolumeFrom(cmd.Context(), args[0], from, mb)
			} else {
				v, err = c.CreateVolume(cmd.Context(), args[0], mb)
			}
			if err != nil {
				return forItem(args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s (%d MiB)\n", v.Name, v.SizeMB)
			return nil
		},
	}
	create.Flags().StringVar(&size, "size", "1G", "disk quota: MiB, or a number with M, G or T (with --from: the snapshotted volume's)")
	create.Flags().StringVar(&from, "from", "", "make the volume a writable copy of this volume snapshot (id or name)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the volumes: size, use and the sessions mounting them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			vs, err := c.Volumes(cmd.Context())
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), g.json, vs, "NAME\tSIZE MIB\tUSED MIB\tWRITER\tREADERS", func(v client.Volume) string {
				w, r := v.WriterSession, strings.Join(v.ReaderSessions, ",")
				if w == "" {
					w = "-"
				}
				if r == "" {
					r = "-"
				}
				return fmt.Sprintf("%s\t%d\t%.1f\t%s\t%s", v.Name, v.SizeMB, float64(v.UsedBytes)/(1<<20), w, r)
			})
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove volumes and their files (refused while a session mounts one)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, name := range args {
				if err := c.DeleteVolume(cmd.Context(), name); err != nil {
					return forItem(name, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), name)
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, rm, newVolumeSnapshotCmd(g), newVolumeSnapshotsCmd(g))
	return cmd
}

// newVolumeSnapshotCmd is "volume snapshot NAME [--name SNAPNAME]".
func newVolumeSnapshotCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "snapshot VOLUME [--name SNAPNAME]",
		Short: "Take a read-only snapshot of a volume (volume create NEW --from SNAPSHOT makes a volume of it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sn, err := c.SnapshotVolume(cmd.Context(), args[0], name)
			if err != nil {
				return forItem(args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), sn)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sn.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "name the snapshot (unique among the tenant's volume snapshots)")
	return cmd
}

// newVolumeSnapshotsCmd is "volume snapshots VOLUME [--rm SNAP...]".
func newVolumeSnapshotsCmd(g *globals) *cobra.Command {
	var rm []string
	cmd := &cobra.Command{
		Use:   "snapshots VOLUME [--rm SNAPSHOT]...",
		Short: "List a volume's snapshots, or remove some (volumes made from them keep their data)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if len(rm) > 0 {
				for _, ref := range rm {
					if err := c.DeleteVolumeSnapshot(cmd.Context(), args[0], ref); err != nil {
						return forItem(ref, err)
					}
					fmt.Fprintln(cmd.OutOrStdout(), ref)
				}
				return nil
			}
			sns, err := c.VolumeSnapshots(cmd.Context(), args[0])
			if err != nil {
				return forItem(args[0], err)
			}
			return printList(cmd.OutOrStdout(), g.json, sns, "ID\tNAME\tSIZE MIB\tUSED MIB\tCREATED", func(sn client.VolumeSnapshot) string {
				n := sn.Name
				if n == "" {
					n = "-"
				}
				return fmt.Sprintf("%s\t%s\t%d\t%.1f\t%s", sn.ID, n, sn.SizeMB, float64(sn.SizeBytes)/(1<<20),
					sn.CreatedAt.Format(time.RFC3339))
			})
		},
	}
	cmd.Flags().StringSliceVar(&rm, "rm", nil, "remove this snapshot (id or name); repeatable")
	return cmd
}

// parseSizeMB reads a size in MiB: a number of MiB, or one with a unit
// M, G or T (binary: 1G is 1024 MiB).
func parseSizeMB(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "IB"), "B")
	mult := int64(1)
	switch {
	case strings.HasSuffix(t, "T"):
		mult, t = 1<<20, strings.TrimSuffix(t, "T")
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<10, strings.TrimSuffix(t, "G")
	case strings.HasSuffix(t, "M"):
		t = strings.TrimSuffix(t, "M")
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("--size %q: want a positive size such as 512M or 10G", s)
	}
	return n * mult, nil
}

// parseVolumeMounts reads --volume NAME:PATH[:ro] values.
func parseVolumeMounts(vs []string) ([]client.VolumeMount, error) {
	var out []client.VolumeMount
	for _, v := range vs {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" || (len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw") {
			return nil, fmt.Errorf("--volume %q: want NAME:PATH or NAME:PATH:ro", v)
		}
		out = append(out, client.VolumeMount{Name: parts[0], Path: parts[1], ReadOnly: len(parts) == 3 && parts[2] == "ro"})
	}
	return out, nil
}

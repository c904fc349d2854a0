package main

import (
	"github.com/urfave/cli/v2"

	"quotad/store"
)

// The flags of more than one command. A command's own flags are beside it.

func socketFlag() *cli.StringFlag {
	return &cli.StringFlag{Name: "socket", Value: "/run/quotad/quotad.sock", EnvVars: []string{"QUOTAD_SOCKET"}, Usage: "path of the Unix socket"}
}

func configFlag(usage string) *cli.StringFlag {
	return &cli.StringFlag{Name: "config", EnvVars: []string{"QUOTAD_CONFIG"}, Usage: usage}
}

func keyPrefixFlag(usage string) *cli.StringFlag {
	return &cli.StringFlag{Name: "key-prefix", Value: "quotad:", EnvVars: []string{"QUOTAD_KEY_PREFIX"}, Usage: usage}
}

// redisFlags are the flags that reach Redis, shared by serve and doctor;
// storeOptions reads them.
func redisFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "redis-url", EnvVars: []string{"QUOTAD_REDIS_URL"}, Usage: "the Redis to use (serve: empty runs an embedded store local to this process; doctor: required). " + redisURLHelp},
		&cli.StringFlag{Name: "redis-ca-file", EnvVars: []string{"QUOTAD_REDIS_CA_FILE"}, Usage: "PEM file of the CAs that sign Redis's TLS certificate (rediss:// URLs); default: the system's"},
		&cli.StringFlag{Name: "redis-password", EnvVars: []string{"QUOTAD_REDIS_PASSWORD"}, Usage: "Redis password, if not in the URL; set it through the env var or --redis-password-file, as arguments are visible in ps"},
		&cli.StringFlag{Name: "redis-password-file", EnvVars: []string{"QUOTAD_REDIS_PASSWORD_FILE"}, Usage: "file holding the Redis password (read at start; a trailing newline is dropped)"},
	}
}

// storeOptions maps redisFlags, and serve's --redis-timeout and
// --redis-flush-delay where the command has them, to the store's options.
func storeOptions(c *cli.Context) store.StoreOptions {
	return store.StoreOptions{
		RedisURL:     c.String("redis-url"),
		CAFile:       c.String("redis-ca-file"),
		Password:     c.String("redis-password"),
		PasswordFile: c.String("redis-password-file"),
		Timeout:      c.Duration("redis-timeout"),
		FlushDelay:   c.Duration("redis-flush-delay"),
	}
}

// redisURLHelp says how --redis-url selects the topology.
const redisURLHelp = `Standalone: redis://[user:pass@]host:6379[/db] (rediss:// for TLS, unix:///path for a socket). ` +
	`Cluster: any node, more nodes as addr=: redis://host1:6379?addr=host2:6379&addr=host3:6379 (a cluster is detected by itself). ` +
	`Sentinel: the sentinels, and the master's name as master_set=: redis://s1:26379?addr=s2:26379&addr=s3:26379&master_set=mymaster ` +
	`(sentinel_password= if the sentinels need one; the URL's password is the master's).`

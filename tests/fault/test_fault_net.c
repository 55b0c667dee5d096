/*
 * test_fault_net.c - network faults: a partition of one rank.
 *
 * Two network namespaces joined by a veth pair (addresses in a private
 * /24 on the pair only): cohortd and ranks 0-2 in namespace A, rank 3 in
 * namespace B, every data-plane socket on the veth addresses
 * (COHORT_DATA_ADDR, COHORT_TCP_SHM=0 so no shared-memory shortcut). While
 * the job runs an allreduce loop, an nftables table in B drops all of rank
 * 3's traffic. Rank 3 does not exit and no connection closes: survivors
 * must get COHORT_EPEERLOST naming rank 3 from the heartbeat detector
 * within dead-after (5 s) + 1 s, and the error must say it stopped
 * answering (missed heartbeats), not that it exited or its connection
 * closed. The measured figure is printed.
 *
 * The namespaces live in an unchecked fixture (it runs in the test
 * runner's process, also when the forked test fails or times out): its
 * teardown kills what still runs in them (`ip netns pids`, by pid), deletes
 * the nftables table and the namespaces. Skipped, with a SKIP line, where
 * `ip netns` is not permitted.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_cohort.h"

Suite *suite_fault_net(void);

#define NET_IP "/usr/sbin/ip"
#define NET_NFT "/usr/sbin/nft"
#define NET_DEAD_AFTER_MS 5000

static char net_ns[2][32];
static char net_addr[2][32];
static char net_veth[2][16];
static bool net_ok;
static char net_why[256];

/* Runs a command line (no shell), quietly; returns its exit code. */
static int
net_run(char *const argv[])
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return (-1);
	if (pid == 0) {
		freopen("/dev/null", "w", stdout);
		freopen("/dev/null", "w", stderr);
		execv(argv[0], argv);
		_exit(127);
	}
	if (waitpid(pid, &st, 0) != pid)
		return (-1);
	return (WIFEXITED(st) ? WEXITSTATUS(st) : 128);
}

#define NET_RUN(...) net_run((char *const[]) { __VA_ARGS__, NULL })

/* Kills what still runs in a namespace (processes this test started). */
static void
net_kill_ns(const char *ns)
{
	char cmd[128], line[64];
	FILE *f;

	snprintf(cmd, sizeof(cmd), NET_IP " netns pids %s 2>/dev/null", ns);
	if ((f = popen(cmd, "r")) == NULL)
		return;
	while (fgets(line, sizeof(line), f) != NULL) {
		long pid = strtol(line, NULL, 10);
		if (pid > 1 && pid != (long)getpid())
			kill((pid_t)pid, SIGKILL);
	}
	pclose(f);
}

static void
net_teardown(void)
{
	if (net_ns[0][0] == '\0')
		return;
	(void)NET_RUN(NET_IP, "netns", "exec", net_ns[1], NET_NFT, "delete",
	    "table", "inet", "cohort_partition");
	for (int i = 0; i < 2; i++) {
		net_kill_ns(net_ns[i]);
		(void)NET_RUN(NET_IP, "netns", "del", net_ns[i]);
	}
	usleep(100 * 1000);
	for (int i = 0; i < 2; i++)
		(void)NET_RUN(NET_IP, "netns", "del", net_ns[i]);
	net_ns[0][0] = '\0';
}

static void
net_setup(void)
{
	int sub = 20 + (int)(getpid() % 200);
	char a0[40], a1[40];

	net_ok = false;
	snprintf(net_ns[0], sizeof(net_ns[0]), "cohort-na-%d", (int)getpid());
	snprintf(net_ns[1], sizeof(net_ns[1]), "cohort-nb-%d", (int)getpid());
	snprintf(net_veth[0], sizeof(net_veth[0]), "cva%d",
	    (int)(getpid() % 100000));
	snprintf(net_veth[1], sizeof(net_veth[1]), "cvb%d",
	    (int)(getpid() % 100000));
	snprintf(net_addr[0], sizeof(net_addr[0]), "10.213.%d.1", sub);
	snprintf(net_addr[1], sizeof(net_addr[1]), "10.213.%d.2", sub);
	snprintf(a0, sizeof(a0), "%s/24", net_addr[0]);
	snprintf(a1, sizeof(a1), "%s/24", net_addr[1]);
	if (access(NET_IP, X_OK) != 0 || access(NET_NFT, X_OK) != 0) {
		snprintf(net_why, sizeof(net_why), "%s or %s missing", NET_IP,
		    NET_NFT);
		net_ns[0][0] = '\0';
		return;
	}
	if (NET_RUN(NET_IP, "netns", "add", net_ns[0]) != 0) {
		snprintf(net_why, sizeof(net_why),
		    "'ip netns add' is not permitted here");
		net_ns[0][0] = '\0';
		return;
	}
	if (NET_RUN(NET_IP, "netns", "add", net_ns[1]) != 0
	    || NET_RUN(NET_IP, "link", "add", net_veth[0], "netns", net_ns[0],
	           "type", "veth", "peer", "name", net_veth[1], "netns",
	           net_ns[1])
	        != 0
	    || NET_RUN(NET_IP, "-n", net_ns[0], "addr", "add", a0, "dev",
	           net_veth[0])
	        != 0
	    || NET_RUN(NET_IP, "-n", net_ns[1], "addr", "add", a1, "dev",
	           net_veth[1])
	        != 0
	    || NET_RUN(
	           NET_IP, "-n", net_ns[0], "link", "set", net_veth[0], "up")
	        != 0
	    || NET_RUN(
	           NET_IP, "-n", net_ns[1], "link", "set", net_veth[1], "up")
	        != 0
	    || NET_RUN(NET_IP, "-n", net_ns[0], "link", "set", "lo", "up") != 0
	    || NET_RUN(NET_IP, "-n", net_ns[1], "link", "set", "lo", "up")
	        != 0) {
		snprintf(net_why, sizeof(net_why),
		    "could not set up the namespaces and the veth pair");
		net_teardown();
		return;
	}
	/* nftables must work in a namespace, too. */
	if (NET_RUN(
	        NET_IP, "netns", "exec", net_ns[1], NET_NFT, "list", "tables")
	    != 0) {
		snprintf(net_why, sizeof(net_why), "nft is not usable");
		net_teardown();
		return;
	}
	net_ok = true;
}

/* Starts argv in namespace ns with extra environment; returns the pid
 * (ip netns exec execs the program: the pid is the program's). */
static pid_t
net_spawn(const char *ns, char *const *argv, char *const *env, const char *out)
{
	char *full[24];
	int n = 0;

	full[n++] = NET_IP;
	full[n++] = "netns";
	full[n++] = "exec";
	full[n++] = (char *)ns;
	for (int i = 0; argv[i] != NULL && n < 23; i++)
		full[n++] = argv[i];
	full[n] = NULL;
	return (th_spawn(full, env, out));
}

START_TEST(test_partition_one_rank)
{
	char url[64], clog[256], cwd[512], bin[4][640];
	char e_coord[96], e_addr[2][64];
	struct th_workers w;
	pid_t cpid;
	int64_t end, t_cut, seen[3];
	int port = 29400 + (int)(getpid() % 1000);

	if (!net_ok) {
		fprintf(stderr, "SKIP fault_net/partition: %s\n", net_why);
		return;
	}
	/* ip netns exec keeps the working directory; absolute paths anyway */
	ck_assert_ptr_nonnull(getcwd(cwd, sizeof(cwd)));
	snprintf(bin[0], sizeof(bin[0]), "%s/%s",
	    th_bindir()[0] == '/' ? "" : cwd, th_bin("cohortd"));
	snprintf(bin[1], sizeof(bin[1]), "%s/%s",
	    th_bindir()[0] == '/' ? "" : cwd, th_bin("cohort-fault-worker"));
	snprintf(url, sizeof(url), "tcp://%s:%d", net_addr[0], port);
	snprintf(clog, sizeof(clog), "%s/cohortd-net.log", th_tmpdir());
	{
		char *argv[] = { bin[0], "--listen", url, NULL };
		cpid = net_spawn(net_ns[0], argv, NULL, clog);
	}
	end = th_now_ms() + 10000;
	while (th_now_ms() < end && !th_file_has(clog, "listening on"))
		usleep(5000);
	ck_assert_msg(
	    th_file_has(clog, "listening on"), "cohortd did not start");

	snprintf(e_coord, sizeof(e_coord), "COHORT_COORDINATOR=%s", url);
	for (int i = 0; i < 2; i++)
		snprintf(e_addr[i], sizeof(e_addr[i]), "COHORT_DATA_ADDR=%s",
		    net_addr[i]);
	w.n = 4;
	for (int r = 0; r < 4; r++) {
		char e_rank[32], *argv[] = { bin[1], "100000", "10", NULL };
		char *env[] = { e_coord, e_addr[r == 3], e_rank,
			"COHORT_WORLD_SIZE=4", "COHORT_JOB=net",
			"COHORT_TOKEN=tok", "COHORT_FW_BYTES=65536",
			"COHORT_TCP_SHM=0", NULL };
		snprintf(e_rank, sizeof(e_rank), "COHORT_RANK=%d", r);
		snprintf(w.out[r], sizeof(w.out[r]), "%s/net-%d.out",
		    th_tmpdir(), r);
		w.status[r] = -1;
		w.pid[r] = net_spawn(net_ns[r == 3], argv, env, w.out[r]);
	}
	end = th_now_ms() + 30000;
	while (th_now_ms() < end && !th_worker_output_has(&w, 0, "STEP 150"))
		usleep(10000);
	ck_assert_msg(th_worker_output_has(&w, 0, "STEP 150"),
	    "the job did not run across the namespaces");

	/* Partition rank 3: drop everything in and out of namespace B. */
	t_cut = th_now_ms();
	ck_assert_int_eq(NET_RUN(NET_IP, "netns", "exec", net_ns[1], NET_NFT,
	                     "add table inet cohort_partition"),
	    0);
	ck_assert_int_eq(
	    NET_RUN(NET_IP, "netns", "exec", net_ns[1], NET_NFT,
	        "add chain inet cohort_partition in { type filter "
	        "hook input priority -300 ; policy drop ; }"),
	    0);
	ck_assert_int_eq(NET_RUN(NET_IP, "netns", "exec", net_ns[1], NET_NFT,
	                     "add chain inet cohort_partition out { type "
	                     "filter hook output priority -300 ; policy drop "
	                     "; }"),
	    0);
	for (int r = 0; r < 3; r++)
		seen[r] = -1;
	end = t_cut + 30000;
	while (
	    th_now_ms() < end && (seen[0] < 0 || seen[1] < 0 || seen[2] < 0)) {
		for (int r = 0; r < 3; r++)
			if (seen[r] < 0
			    && th_worker_output_has(&w, r, "RESULT "))
				seen[r] = th_now_ms() - t_cut;
		usleep(10000);
	}
	fprintf(stderr,
	    "MEASURE partition of rank 3: survivors got the error after "
	    "%" PRId64 ", %" PRId64 ", %" PRId64 " ms (dead-after %d ms)\n",
	    seen[0], seen[1], seen[2], NET_DEAD_AFTER_MS);
	for (int r = 0; r < 3; r++) {
		char *o = th_worker_output(&w, r);
		ck_assert_msg(seen[r] >= 0, "rank %d never failed: %s", r, o);
		/* generous: dead-after + 1 s + a loaded machine */
		ck_assert_int_le(seen[r], NET_DEAD_AFTER_MS + 4000);
		ck_assert_msg(strstr(o, "status=COHORT_EPEERLOST") != NULL
		        && strstr(o, "rank 3") != NULL
		        && strstr(o, "no heartbeat") != NULL
		        && strstr(o, "connection lost") == NULL
		        && strstr(o, "exited") == NULL,
		    "rank %d: %s", r, o);
		free(o);
	}
	ck_assert_msg(
	    th_file_has(clog, "rank 3") && th_file_has(clog, "no heartbeat"),
	    "cohortd's log does not say rank 3 stopped answering");
	/* Survivors exit by themselves; rank 3 is cut off: the fixture
	 * kills it (and cohortd) when it removes the namespaces. */
	for (int r = 0; r < 3; r++) {
		int st;
		ck_assert_msg(
		    th_wait(w.pid[r], 15000, &st), "rank %d hung", r);
		ck_assert_int_eq(th_exit_code(st), 3);
	}
	th_kill(w.pid[3]);
	kill(cpid, SIGTERM);
	if (!th_wait(cpid, 10000, NULL))
		th_kill(cpid);
	ck_assert_int_eq(NET_RUN(NET_IP, "netns", "exec", net_ns[1], NET_NFT,
	                     "delete table inet cohort_partition"),
	    0);
}
END_TEST

Suite *
suite_fault_net(void)
{
	Suite *s = suite_create("fault_net");
	TCase *tc;

	tc = th_suite_case(
	    s, "partition", 90, NULL, NULL, test_partition_one_rank, NULL);
	tcase_add_unchecked_fixture(tc, net_setup, net_teardown);
	return (s);
}

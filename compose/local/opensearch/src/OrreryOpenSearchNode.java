import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;

import org.apache.logging.log4j.LogManager;
import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.painless.PainlessPlugin;
import org.opensearch.plugins.Plugin;
import org.opensearch.transport.Netty4Plugin;

/**
 * Single-node OpenSearch for local tests (started by tests/harness/servers.py).
 *
 * <p>This is the "embedded node" pattern: the modules a distribution would load from its
 * {@code modules/} directory (netty4 transport + HTTP, analysis-common, painless) are passed
 * as classpath plugins instead. There is no security plugin, so HTTP is plain and
 * unauthenticated; there is no Java security manager and no bootstrap checks (those live in
 * {@code org.opensearch.bootstrap.Bootstrap}, which this does not use). Only for tests.
 *
 * <p>Usage: {@code java -cp <classes>:<lib>/* OrreryOpenSearchNode HOME HTTP_PORT TRANSPORT_PORT}
 * for a single node, or {@code ... HOME HTTP_PORT TRANSPORT_PORT NODE_NAME SEED_HOSTS MANAGERS}
 * for one node of a loopback cluster: {@code SEED_HOSTS} is a comma-separated list of
 * {@code 127.0.0.1:transport_port}, {@code MANAGERS} the comma-separated names of the
 * cluster-manager-eligible nodes (the initial voting configuration); a node not named
 * there holds data only.
 * HOME gets {@code data/} and {@code logs/}. Logging goes wherever the log4j2 configuration
 * given by {@code -Dlog4j2.configurationFile} sends it (start the JVM with
 * {@code -Dlog4j2.shutdownHookEnabled=false}; this class shuts log4j down itself after the node).
 * The JVM runs until it is killed; SIGTERM closes the node cleanly through a shutdown hook.
 */
public final class OrreryOpenSearchNode extends Node {

    private static final List<Class<? extends Plugin>> PLUGINS =
        Arrays.asList(Netty4Plugin.class, CommonAnalysisPlugin.class, PainlessPlugin.class);

    private OrreryOpenSearchNode(Environment environment, Collection<Class<? extends Plugin>> plugins) {
        super(environment, plugins, true);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3 && args.length != 6) {
            System.err.println("usage: OrreryOpenSearchNode HOME HTTP_PORT TRANSPORT_PORT "
                + "[NODE_NAME SEED_HOSTS MANAGERS]");
            System.exit(2);
        }
        boolean cluster = args.length == 6;
        String nodeName = cluster ? args[3] : "orrery-node-1";
        Path home = Paths.get(args[0]).toAbsolutePath();
        Files.createDirectories(home.resolve("config"));
        Files.createDirectories(home.resolve("data"));
        Files.createDirectories(home.resolve("logs"));

        Settings.Builder builder = Settings.builder()
            .put("cluster.name", cluster ? "orrery-cluster-" + args[4].hashCode() : "orrery-test")
            .put("node.name", nodeName)
            .put("path.home", home.toString())
            .put("path.data", home.resolve("data").toString())
            .put("path.logs", home.resolve("logs").toString())
            .put("network.host", "127.0.0.1")
            .put("http.port", args[1])
            .put("transport.port", args[2])
            // A test box may have little free disk; never flip indices to read-only.
            .put("cluster.routing.allocation.disk.threshold_enabled", false)
            .put("action.auto_create_index", true);
        if (cluster) {
            List<String> managers = Arrays.asList(args[5].split(","));
            builder.putList("discovery.seed_hosts", Arrays.asList(args[4].split(",")));
            builder.putList("cluster.initial_cluster_manager_nodes", managers);
            builder.putList("node.roles", managers.contains(nodeName)
                ? Arrays.asList("cluster_manager", "data", "ingest")
                : Arrays.asList("data", "ingest"));
            // A stopped node's shard copies are re-allocated at once (tests stop nodes).
            builder.put("cluster.routing.allocation.node_concurrent_recoveries", 4);
        } else {
            builder.put("discovery.type", "single-node");
        }
        Settings settings = builder.build();

        // Logging is configured by log4j itself from -Dlog4j2.configurationFile. Do not call
        // LogConfigurator.configureWithoutConfig: it installs an empty configuration that
        // replaces the file's and silences every logger.
        LogConfigurator.setNodeName(nodeName);

        Environment environment = InternalSettingsPreparer.prepareEnvironment(
            settings, Collections.emptyMap(), home.resolve("config"), () -> nodeName);
        Node node = new OrreryOpenSearchNode(environment, PLUGINS);

        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                // The JVM runs with -Dlog4j2.shutdownHookEnabled=false (as the distribution
                // does) so that the node's own "stopped"/"closed" lines still reach the log.
                LogManager.shutdown();
                stopped.countDown();
            }
        }, "orrery-shutdown"));

        node.start();
        System.out.println("OrreryOpenSearchNode started: http://127.0.0.1:" + args[1]);
        // Node threads are daemons, so keep the main thread parked until shutdown.
        stopped.await();
    }
}

package io.changefeed.bench;

import com.azure.cosmos.ChangeFeedProcessor;
import com.azure.cosmos.ChangeFeedProcessorBuilder;
import com.azure.cosmos.CosmosAsyncClient;
import com.azure.cosmos.CosmosAsyncContainer;
import com.azure.cosmos.CosmosClientBuilder;
import com.azure.cosmos.models.ChangeFeedProcessorOptions;
import com.azure.cosmos.models.CosmosQueryRequestOptions;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One instance of the Java v4 change feed processor with a handler that only counts, as a
 * benchmark peer of cfp. It talks to the account the way any Java application does (gateway
 * mode, account key) and reports on stdout, one JSON object a line:
 *
 * <ul>
 *   <li>{@code {"event":"started","ms":M}} once {@code start()} has returned (M since launch);
 *   <li>{@code {"event":"first","ms":M}} when the first batch arrives (M since {@code start()} was called);
 *   <li>{@code {"event":"drained","docs":N,"ms":M}} when {@code --expect} documents have been handled;
 *   <li>{@code {"event":"stopped","docs":N}} after a clean stop (stdin closed or "stop" read).
 * </ul>
 *
 * Usage: {@code java -jar java-peer.jar --endpoint E --key K --database D --feed C --leases L
 * --prefix P --host H [--layout epk|pk] [--max-items N] [--expect N] [--renew-ms N]
 * [--acquire-ms N] [--expiration-ms N] [--poll-ms N] [--release-grace-ms N]} (the longest wait,
 * after a stop, for its leases to be released)
 */
public final class Peer {
    private Peer() {}

    public static void main(String[] args) throws Exception {
        long launched = System.nanoTime();
        Map<String, String> opts = parse(args);
        String endpoint = required(opts, "endpoint");
        String key = required(opts, "key");
        CosmosAsyncClient client = new CosmosClientBuilder()
            .endpoint(endpoint)
            .key(key)
            .gatewayMode()
            .contentResponseOnWriteEnabled(true)
            .buildAsyncClient();
        CosmosAsyncContainer feed = client.getDatabase(required(opts, "database")).getContainer(required(opts, "feed"));
        CosmosAsyncContainer leases = client.getDatabase(required(opts, "database")).getContainer(required(opts, "leases"));

        ChangeFeedProcessorOptions options = new ChangeFeedProcessorOptions()
            .setLeasePrefix(opts.getOrDefault("prefix", ""))
            .setMaxItemCount(Integer.parseInt(opts.getOrDefault("max-items", "1000")))
            .setStartFromBeginning(true);
        if (opts.containsKey("renew-ms")) {
            options.setLeaseRenewInterval(millis(opts, "renew-ms"));
        }
        if (opts.containsKey("acquire-ms")) {
            options.setLeaseAcquireInterval(millis(opts, "acquire-ms"));
        }
        if (opts.containsKey("expiration-ms")) {
            options.setLeaseExpirationInterval(millis(opts, "expiration-ms"));
        }
        if (opts.containsKey("poll-ms")) {
            options.setFeedPollDelay(millis(opts, "poll-ms"));
        }

        long expect = Long.parseLong(opts.getOrDefault("expect", "0"));
        AtomicLong handled = new AtomicLong();
        AtomicBoolean first = new AtomicBoolean();
        AtomicBoolean drained = new AtomicBoolean();
        long[] startCalled = {0};
        ChangeFeedProcessorBuilder builder = new ChangeFeedProcessorBuilder()
            .hostName(required(opts, "host"))
            .feedContainer(feed)
            .leaseContainer(leases)
            .options(options);
        Runnable onBatch = () -> {
            if (first.compareAndSet(false, true)) {
                emit("{\"event\":\"first\",\"ms\":" + sinceMillis(startCalled[0]) + "}");
            }
        };
        if ("pk".equals(opts.getOrDefault("layout", "epk"))) {
            builder.handleChanges(docs -> {
                onBatch.run();
                count(handled, docs.size(), expect, drained, startCalled[0]);
            });
        } else {
            builder.handleLatestVersionChanges(items -> {
                onBatch.run();
                count(handled, items.size(), expect, drained, startCalled[0]);
            });
        }
        ChangeFeedProcessor processor = builder.buildChangeFeedProcessor();
        startCalled[0] = System.nanoTime();
        processor.start().block();
        emit("{\"event\":\"started\",\"ms\":" + sinceMillis(launched) + "}");

        BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = stdin.readLine()) != null && !line.trim().equals("stop")) {
            // Anything else on stdin is ignored; the harness closes it or writes "stop".
        }
        processor.stop().block(Duration.ofSeconds(30));
        // stop() cancels the partition workers and returns at once; they release their leases
        // on the way out: wait for that, as an application that keeps running would (bounded).
        awaitReleased(leases, opts.getOrDefault("prefix", ""), required(opts, "host"),
            Long.parseLong(opts.getOrDefault("release-grace-ms", "20000")));
        emit("{\"event\":\"stopped\",\"docs\":" + handled.get() + "}");
        client.close();
        System.exit(0);
    }

    /** Waits, at most {@code boundMillis}, until no lease under {@code prefix} names {@code host} its owner. */
    private static void awaitReleased(CosmosAsyncContainer leases, String prefix, String host, long boundMillis)
            throws InterruptedException {
        long deadline = System.nanoTime() + boundMillis * 1_000_000L;
        while (System.nanoTime() < deadline) {
            try {
                List<ObjectNode> docs = leases.queryItems("SELECT * FROM c", new CosmosQueryRequestOptions(), ObjectNode.class)
                    .collectList()
                    .block(Duration.ofSeconds(10));
                boolean held = docs != null && docs.stream().anyMatch(doc ->
                    doc.path("id").asText().startsWith(prefix) && host.equals(doc.path("Owner").asText()));
                if (!held) {
                    return;
                }
            } catch (RuntimeException e) {
                // A listing that failed is tried again until the bound.
            }
            Thread.sleep(100);
        }
    }

    private static void count(AtomicLong handled, int n, long expect, AtomicBoolean drained, long started) {
        long total = handled.addAndGet(n);
        if (expect > 0 && total >= expect && drained.compareAndSet(false, true)) {
            emit("{\"event\":\"drained\",\"docs\":" + total + ",\"ms\":" + sinceMillis(started) + "}");
        }
    }

    private static long sinceMillis(long nanos) {
        return (System.nanoTime() - nanos) / 1_000_000;
    }

    private static synchronized void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    private static Duration millis(Map<String, String> opts, String name) {
        return Duration.ofMillis(Long.parseLong(opts.get(name)));
    }

    private static String required(Map<String, String> opts, String name) {
        String value = opts.get(name);
        if (value == null) {
            System.err.println("java-peer: --" + name + " is required");
            System.exit(2);
        }
        return value;
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                System.err.println("java-peer: expected --name value, got " + args[i]);
                System.exit(2);
            }
            opts.put(args[i].substring(2), args[i + 1]);
        }
        return opts;
    }
}

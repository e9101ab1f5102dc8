// A line-based driver for Apache Curator's lock recipes, for aiolocks' interop tests.
//
// The Python tests start it (java -cp <classes>:curator-recipes.jar CuratorDriver), write one
// command per line on stdin and read one reply line per command on stdout. Replies of
// commands that may block (acquire, try, release, latch start/close) come later, from the
// handle's own thread: Curator's InterProcessMutex must be released by the thread that
// acquired it, so every handle has a single thread that runs its commands in order.
// Tokens never contain spaces (the tests choose the paths and ids).
//
//   client <cid> <connectString> <namespace> <sessionTimeoutMs>  -> "client <cid> ok"
//   expire <cid>               kill the session from a second connection -> "expired <cid>"
//   mutex <hid> <cid> <path>                    InterProcessMutex
//   semmutex <hid> <cid> <path>                 InterProcessSemaphoreMutex
//   sem <hid> <cid> <path> <maxLeases>          InterProcessSemaphoreV2
//   read|write <hid> <cid> <path>               InterProcessReadWriteLock's read/write lock
//   rwpair <hid> <cid> <path>                   one InterProcessReadWriteLock: <hid>.r, <hid>.w
//   latch <hid> <cid> <path> <participantId>    LeaderLatch
//       each replies "<kind> <hid> ok"
//   acquire <hid>          -> "acquired <hid>"   (latch: start, then "leader <hid> true" later)
//   try <hid> <ms>         -> "tried <hid> true|false"
//   release <hid>          -> "released <hid>"   (latch: close)
//   participants <hid>     -> "participants <hid> <id>=<leader>,..." (latch) or
//                             "participants <hid> <node>,..." (locks: getParticipantNodes)
//   quit
// Errors: "error <hid> <exception>". Connection states: "state <cid> <STATE>".

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooKeeper;

public final class CuratorDriver {
    private static final Map<String, CuratorFramework> clients = new ConcurrentHashMap<>();
    private static final Map<String, String> connectStrings = new ConcurrentHashMap<>();
    private static final Map<String, Handle> handles = new ConcurrentHashMap<>();

    /** One recipe object and the one thread that runs its commands. */
    private static final class Handle {
        final String id;
        final ExecutorService thread;
        InterProcessLock lock;              // mutex, semaphore mutex, read, write
        InterProcessSemaphoreV2 semaphore;  // semaphore
        Lease lease;                        // the semaphore's lease while held
        LeaderLatch latch;                  // leader latch

        Handle(String id, ExecutorService thread) {
            this.id = id;
            this.thread = thread;
        }
    }

    static synchronized void reply(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] t = line.trim().split(" ");
            if (t.length == 0 || t[0].isEmpty()) {
                continue;
            }
            if (t[0].equals("quit")) {
                break;
            }
            try {
                command(t);
            } catch (Exception e) {
                reply("error " + (t.length > 1 ? t[1] : "-") + " " + e);
            }
        }
        for (Handle h : handles.values()) {
            h.thread.shutdownNow();
        }
        for (CuratorFramework c : clients.values()) {
            c.close();
        }
        System.exit(0);
    }

    private static void command(String[] t) throws Exception {
        switch (t[0]) {
            case "client": newClient(t[1], t[2], t[3], Integer.parseInt(t[4])); break;
            case "expire": expire(t[1]); break;
            case "mutex": add(t[1]).lock = new InterProcessMutex(client(t[2]), t[3]); break;
            case "semmutex": add(t[1]).lock = new InterProcessSemaphoreMutex(client(t[2]), t[3]); break;
            case "sem":
                add(t[1]).semaphore = new InterProcessSemaphoreV2(client(t[2]), t[3], Integer.parseInt(t[4]));
                break;
            case "read": add(t[1]).lock = new InterProcessReadWriteLock(client(t[2]), t[3]).readLock(); break;
            case "write": add(t[1]).lock = new InterProcessReadWriteLock(client(t[2]), t[3]).writeLock(); break;
            case "rwpair": {
                InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client(t[2]), t[3]);
                // both halves on one thread: Curator's downgrade is per thread
                Handle r = add(t[1] + ".r");
                r.lock = rw.readLock();
                add(t[1] + ".w", r.thread).lock = rw.writeLock();
                break;
            }
            case "latch": newLatch(add(t[1]), client(t[2]), t[3], t[4]); break;
            case "acquire": acquire(handle(t[1])); return;
            case "try": tryAcquire(handle(t[1]), Long.parseLong(t[2])); return;
            case "release": release(handle(t[1])); return;
            case "participants": participants(handle(t[1])); return;
            default: throw new IllegalArgumentException("unknown command " + t[0]);
        }
        reply(t[0] + " " + t[1] + " ok");
    }

    private static Handle add(String id) {
        return add(id, Executors.newSingleThreadExecutor());
    }

    private static Handle add(String id, ExecutorService thread) {
        Handle h = new Handle(id, thread);
        if (handles.putIfAbsent(id, h) != null) {
            throw new IllegalArgumentException("handle " + id + " exists");
        }
        return h;
    }

    private static Handle handle(String id) {
        Handle h = handles.get(id);
        if (h == null) {
            throw new IllegalArgumentException("no handle " + id);
        }
        return h;
    }

    private static CuratorFramework client(String id) {
        CuratorFramework c = clients.get(id);
        if (c == null) {
            throw new IllegalArgumentException("no client " + id);
        }
        return c;
    }

    private static void newClient(String id, String connect, String namespace, int timeoutMs) throws Exception {
        CuratorFrameworkFactory.Builder b = CuratorFrameworkFactory.builder()
            .connectString(connect)
            .sessionTimeoutMs(timeoutMs)
            .connectionTimeoutMs(10000)
            .retryPolicy(new RetryNTimes(50, 100));
        if (!namespace.equals("-")) {
            b = b.namespace(namespace);
        }
        CuratorFramework c = b.build();
        c.getConnectionStateListenable().addListener((cl, state) -> reply("state " + id + " " + state));
        c.start();
        if (!c.blockUntilConnected(20, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no connection to " + connect);
        }
        clients.put(id, c);
        connectStrings.put(id, connect);
    }

    /** Expire the client's session: join it from a second connection, then close that one. */
    private static void expire(String id) throws Exception {
        ZooKeeper zk = client(id).getZookeeperClient().getZooKeeper();
        long session = zk.getSessionId();
        byte[] password = zk.getSessionPasswd();
        CountDownLatch connected = new CountDownLatch(1);
        Watcher watcher = event -> {
            if (event.getState() == Watcher.Event.KeeperState.SyncConnected) {
                connected.countDown();
            }
        };
        ZooKeeper intruder = new ZooKeeper(connectStrings.get(id), 10000, watcher, session, password);
        try {
            if (!connected.await(10, TimeUnit.SECONDS)) {
                throw new IllegalStateException("could not join session " + Long.toHexString(session));
            }
        } finally {
            intruder.close();
        }
        reply("expired " + id);
    }

    private static void newLatch(Handle h, CuratorFramework client, String path, String participant) {
        h.latch = new LeaderLatch(client, path, participant);
        h.latch.addListener(new LeaderLatchListener() {
            @Override
            public void isLeader() {
                reply("leader " + h.id + " true");
            }

            @Override
            public void notLeader() {
                reply("leader " + h.id + " false");
            }
        });
    }

    private static void acquire(Handle h) {
        h.thread.submit(() -> {
            try {
                if (h.latch != null) {
                    h.latch.start();
                } else if (h.semaphore != null) {
                    h.lease = h.semaphore.acquire();
                } else {
                    h.lock.acquire();
                }
                reply("acquired " + h.id);
            } catch (Exception e) {
                reply("error " + h.id + " " + e);
            }
        });
    }

    private static void tryAcquire(Handle h, long ms) {
        h.thread.submit(() -> {
            try {
                boolean got;
                if (h.semaphore != null) {
                    h.lease = h.semaphore.acquire(ms, TimeUnit.MILLISECONDS);
                    got = h.lease != null;
                } else {
                    got = h.lock.acquire(ms, TimeUnit.MILLISECONDS);
                }
                reply("tried " + h.id + " " + got);
            } catch (Exception e) {
                reply("error " + h.id + " " + e);
            }
        });
    }

    private static void release(Handle h) {
        h.thread.submit(() -> {
            try {
                if (h.latch != null) {
                    h.latch.close();
                } else if (h.semaphore != null) {
                    Lease lease = h.lease;
                    h.lease = null;
                    h.semaphore.returnLease(lease);
                } else {
                    h.lock.release();
                }
                reply("released " + h.id);
            } catch (Exception e) {
                reply("error " + h.id + " " + e);
            }
        });
    }

    private static void participants(Handle h) {
        h.thread.submit(() -> {
            try {
                List<String> out = new ArrayList<>();
                if (h.latch != null) {
                    for (Participant p : h.latch.getParticipants()) {
                        out.add(p.getId() + "=" + p.isLeader());
                    }
                } else {
                    Collection<String> nodes;
                    if (h.semaphore != null) {
                        nodes = h.semaphore.getParticipantNodes();
                    } else if (h.lock instanceof InterProcessMutex) {
                        nodes = ((InterProcessMutex) h.lock).getParticipantNodes();
                    } else {
                        throw new IllegalArgumentException("no participants for " + h.id);
                    }
                    out.addAll(nodes);
                }
                reply("participants " + h.id + " " + String.join(",", out));
            } catch (Exception e) {
                reply("error " + h.id + " " + e);
            }
        });
    }
}

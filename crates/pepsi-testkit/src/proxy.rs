//! A TCP proxy on a loopback port whose target can be changed while it runs, as HAProxy in
//! front of a PostgreSQL primary is (docs/ha.md, "PostgreSQL"): `point` cuts every proxied
//! connection and sends new ones to the new target, or refuses them while there is none.
//! It runs on a thread of its own, so a test's own runtime may block without stalling it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy forwards to: a generation (bumped by every `point`) and the target.
#[derive(Clone, Copy, PartialEq)]
struct Route {
    generation: u64,
    target: Option<SocketAddr>,
    stopped: bool,
}

pub struct Proxy {
    pub port: u16,
    route: watch::Sender<Route>,
    connections: Arc<Mutex<u64>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `127.0.0.1:<target>` (None: refusing).
    pub fn start(target: Option<u16>) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy port");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let port = listener.local_addr().expect("proxy address").port();
        let (route, watcher) = watch::channel(Route {
            generation: 0,
            target: target.map(loopback),
            stopped: false,
        });
        let connections = Arc::new(Mutex::new(0));
        let counted = connections.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(serve(listener, watcher, counted));
        });
        Proxy {
            port,
            route,
            connections,
            thread: Some(thread),
        }
    }

    /// From now on new connections go to `127.0.0.1:<target>` (None: they are closed at
    /// once); every connection proxied so far is cut.
    pub fn point(&self, target: Option<u16>) {
        self.route.send_modify(|r| {
            r.generation += 1;
            r.target = target.map(loopback);
        });
    }

    /// How many client connections the proxy has accepted so far.
    pub fn connections(&self) -> u64 {
        *self.connections.lock().unwrap()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.route.send_modify(|r| r.stopped = true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn serve(
    listener: std::net::TcpListener,
    mut watcher: watch::Receiver<Route>,
    connections: Arc<Mutex<u64>>,
) {
    let listener = TcpListener::from_std(listener).expect("tokio listener");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                *connections.lock().unwrap() += 1;
                let route = *watcher.borrow();
                tokio::spawn(forward(client, route, watcher.clone()));
            }
            changed = watcher.changed() => {
                if changed.is_err() || watcher.borrow().stopped {
                    return;
                }
            }
        }
    }
}

/// Copies both ways until either side closes or the route changes.
async fn forward(mut client: TcpStream, route: Route, mut watcher: watch::Receiver<Route>) {
    let Some(target) = route.target else { return };
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let cut = async {
        loop {
            if watcher.changed().await.is_err() {
                return;
            }
            let now = *watcher.borrow();
            if now.generation != route.generation || now.stopped {
                return;
            }
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cut => {}
    }
}

//! A plain-http listener that records the head of every request it receives (as a tenant's
//! endpoint would, to catch a token or a signature) and answers 404.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The listener and what it received.
pub struct Recording {
    /// `http://127.0.0.1:<port>/`.
    pub endpoint: String,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Recording {
    /// Listens on a free loopback port until the test ends.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}/", listener.local_addr().expect("address"));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = vec![0u8; 16 * 1024];
                    let read = stream.read(&mut head).await.unwrap_or(0);
                    seen.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(String::from_utf8_lossy(&head[..read]).into_owned());
                    let _ = stream
                        .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await;
                });
            }
        });
        Self { endpoint, heads }
    }

    /// The request heads received so far.
    pub fn heads(&self) -> Vec<String> {
        self.heads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

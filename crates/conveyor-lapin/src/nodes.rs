//! The nodes a connection may dial: the URL's, then the fallback nodes of
//! [`LapinBrokerBuilder::fallback_nodes`](crate::LapinBrokerBuilder::fallback_nodes), in
//! turn.

use std::sync::Mutex;

use lapin::uri::AMQPUri;

/// Parses a fallback node's `host:port`. The error names what is wrong without echoing
/// an address that holds credentials.
pub(crate) fn parse_node(address: &str) -> Result<(String, u16), String> {
    if address.contains('@') || address.contains('/') {
        return Err(
            "a fallback node is host:port, with no scheme, credentials or vhost \
             (those of the broker's URL serve every node)"
                .into(),
        );
    }
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("{address}: a fallback node is host:port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{address}: the host is missing"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| format!("{address}: the port is not a number from 1 to 65535"))?;
    Ok((host.to_string(), port))
}

/// The nodes one connection dials, in turn: an attempt goes to the current node; a
/// failed attempt, or a connection that was lost, moves on to the next (wrapping round),
/// so that a dial starts after the node that last failed.
pub(crate) struct Rotation {
    /// Each node's URI: the broker's URL with the node's host and port.
    nodes: Vec<AMQPUri>,
    state: Mutex<Turn>,
}

struct Turn {
    /// The node the next attempt goes to.
    next: usize,
    /// The last attempt's stream was handed over: the connection on it, or its
    /// handshake, has since been lost if another attempt is asked for.
    handed_over: bool,
    /// The node whose stream was handed over last: the one the connection is on, or
    /// was on last.
    in_use: Option<usize>,
}

impl Rotation {
    /// The URL's node first, then `fallbacks` (host, port) in order.
    pub(crate) fn new(uri: &AMQPUri, fallbacks: &[(String, u16)]) -> Self {
        let mut nodes = vec![uri.clone()];
        nodes.extend(fallbacks.iter().map(|(host, port)| {
            let mut node = uri.clone();
            node.authority.host.clone_from(host);
            node.authority.port = *port;
            node
        }));
        Rotation {
            nodes,
            state: Mutex::new(Turn {
                next: 0,
                handed_over: false,
                in_use: None,
            }),
        }
    }

    /// The node for the next attempt, and its `host:port` for the logs. If the previous
    /// attempt's stream was handed over, the connection on it has been lost (lapin asks
    /// for a stream only then): the attempt goes to the next node.
    pub(crate) fn attempt(&self) -> (AMQPUri, String) {
        let mut turn = conveyor::kit::lock(&self.state);
        if std::mem::take(&mut turn.handed_over) {
            turn.next = (turn.next + 1) % self.nodes.len();
        }
        (self.nodes[turn.next].clone(), self.address(turn.next))
    }

    /// The `host:port` of node `index`.
    fn address(&self, index: usize) -> String {
        let node = &self.nodes[index];
        format!("{}:{}", node.authority.host, node.authority.port)
    }

    /// The `host:port` of the node the connection is on (or was on last, while it
    /// reconnects), for the logs: the URL's may not be the one in use.
    pub(crate) fn in_use(&self) -> Option<String> {
        let in_use = conveyor::kit::lock(&self.state).in_use;
        in_use.map(|index| self.address(index))
    }

    /// Every node's `host:port`, the URL's first, for an error that names them all.
    pub(crate) fn addresses(&self) -> Vec<String> {
        (0..self.nodes.len())
            .map(|index| self.address(index))
            .collect()
    }

    /// The attempt failed (refused, unreachable, timed out): the next goes to the next
    /// node.
    pub(crate) fn failed(&self) {
        let mut turn = conveyor::kit::lock(&self.state);
        turn.handed_over = false;
        turn.next = (turn.next + 1) % self.nodes.len();
    }

    /// The attempt's stream was handed to lapin for its handshake.
    pub(crate) fn handed_over(&self) {
        let mut turn = conveyor::kit::lock(&self.state);
        turn.handed_over = true;
        turn.in_use = Some(turn.next);
    }

    /// How many nodes there are: 1 without fallbacks.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rotation() -> Rotation {
        let uri = crate::url::parse("amqp://app:s3cret@a:5672/prod").unwrap();
        Rotation::new(&uri, &[("b".into(), 5682), ("c".into(), 5683)])
    }

    fn next(rotation: &Rotation) -> String {
        rotation.attempt().1
    }

    #[test]
    fn the_urls_node_goes_first_and_failures_move_on_in_order_wrapping_round() {
        let rotation = rotation();
        assert_eq!(next(&rotation), "a:5672");
        rotation.failed();
        assert_eq!(next(&rotation), "b:5682");
        rotation.failed();
        assert_eq!(next(&rotation), "c:5683");
        rotation.failed();
        assert_eq!(next(&rotation), "a:5672");
    }

    #[test]
    fn a_lost_connection_reconnects_to_the_node_after_it() {
        let rotation = rotation();
        rotation.failed();
        assert_eq!(next(&rotation), "b:5682");
        rotation.handed_over();
        // Lost: lapin asks again.
        assert_eq!(next(&rotation), "c:5683");
        rotation.failed();
        assert_eq!(next(&rotation), "a:5672");
    }

    #[test]
    fn the_node_in_use_is_the_one_whose_stream_was_handed_over_last() {
        let rotation = rotation();
        assert_eq!(rotation.in_use(), None);
        rotation.failed();
        let _ = rotation.attempt();
        rotation.handed_over();
        assert_eq!(rotation.in_use().as_deref(), Some("b:5682"));
        // Lost, and reconnecting: still the node it was on, until another takes over.
        let _ = rotation.attempt();
        rotation.failed();
        assert_eq!(rotation.in_use().as_deref(), Some("b:5682"));
        let _ = rotation.attempt();
        rotation.handed_over();
        assert_eq!(rotation.in_use().as_deref(), Some("a:5672"));
        assert_eq!(rotation.addresses(), ["a:5672", "b:5682", "c:5683"]);
    }

    #[test]
    fn a_handed_over_stream_moves_on_only_once() {
        let rotation = rotation();
        rotation.handed_over();
        assert_eq!(next(&rotation), "b:5682");
        assert_eq!(next(&rotation), "b:5682");
    }

    #[test]
    fn every_node_keeps_the_urls_credentials_vhost_and_scheme() {
        let rotation = rotation();
        rotation.failed();
        let (node, _) = rotation.attempt();
        assert_eq!(node.authority.userinfo.username, "app");
        assert_eq!(node.authority.userinfo.password, "s3cret");
        assert_eq!(node.vhost, "prod");
        assert_eq!(rotation.len(), 3);
    }

    #[test]
    fn without_fallbacks_every_attempt_goes_to_the_urls_node() {
        let uri = crate::url::parse("amqp://a:5672/%2f").unwrap();
        let rotation = Rotation::new(&uri, &[]);
        rotation.failed();
        rotation.handed_over();
        assert_eq!(next(&rotation), "a:5672");
    }

    #[test]
    fn a_fallback_node_is_host_and_port_and_its_error_never_shows_credentials() {
        assert_eq!(parse_node("b:5682"), Ok(("b".into(), 5682)));
        assert_eq!(parse_node("[::1]:5682"), Ok(("::1".into(), 5682)));
        for bad in ["b", "b:0", "b:x", ":5682", "b:99999"] {
            assert!(parse_node(bad).is_err(), "{bad}");
        }
        let Err(reason) = parse_node("amqp://app:s3cret@b:5682") else {
            panic!("a URL was taken for a node");
        };
        assert!(!reason.contains("s3cret"), "{reason}");
    }
}

//! TLS settings for `amqps://` connections: private CAs to trust and a client identity,
//! turned into lapin's [`OwnedTLSConfig`] (which lapin keeps and re-uses on every
//! reconnect).

use std::io;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};

use crate::error::LapinError;

const PEM_CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----";
const PEM_PRIVATE_KEY_END: &str = "PRIVATE KEY-----";

/// What the builder collected; validated when the broker connects.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    /// PEM certificates to trust besides the webpki roots (none: the roots alone).
    ca_certificates: Vec<String>,
    /// A client certificate chain and its private key, both PEM.
    identity: Option<(String, String)>,
}

impl TlsSettings {
    pub(crate) fn add_ca_certificate(&mut self, pem: String) {
        self.ca_certificates.push(pem);
    }

    pub(crate) fn set_identity(&mut self, certificate_chain: String, private_key: String) {
        self.identity = Some((certificate_chain, private_key));
    }

    /// Whether anything was configured (as opposed to the defaults).
    pub(crate) fn is_configured(&self) -> bool {
        !self.ca_certificates.is_empty() || self.identity.is_some()
    }

    /// lapin's TLS configuration, after checking that each PEM holds what it should:
    /// rustls skips a PEM without certificates silently, which would only show later as
    /// an untrusted server certificate.
    pub(crate) fn to_lapin(&self) -> Result<OwnedTLSConfig, LapinError> {
        for pem in &self.ca_certificates {
            if !pem.contains(PEM_CERTIFICATE) {
                return Err(LapinError::Invalid {
                    what: "TLS CA certificate",
                    reason: format!("no PEM certificate (`{PEM_CERTIFICATE}`) in it"),
                });
            }
        }
        let identity = match &self.identity {
            None => None,
            Some((chain, key)) => {
                if !chain.contains(PEM_CERTIFICATE) {
                    return Err(LapinError::Invalid {
                        what: "TLS client certificate",
                        reason: format!("no PEM certificate (`{PEM_CERTIFICATE}`) in it"),
                    });
                }
                if !key.contains(PEM_PRIVATE_KEY_END) {
                    return Err(LapinError::Invalid {
                        what: "TLS client private key",
                        reason: "no PEM private key (`-----BEGIN ... PRIVATE KEY-----`) in it"
                            .to_string(),
                    });
                }
                Some(OwnedIdentity::PKCS8 {
                    pem: chain.clone().into_bytes(),
                    key: key.clone().into_bytes(),
                })
            }
        };
        let cert_chain =
            (!self.ca_certificates.is_empty()).then(|| self.ca_certificates.join("\n"));
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }
}

/// Never prints key material; certificates are public but long, so they are counted.
impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca_certificates", &self.ca_certificates.len())
            .field(
                "client_identity",
                &self.identity.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Whether a failed first connection is about TLS (the handshake, a certificate, the
/// PEM given) rather than the network: rustls and the PEM parser report those as
/// invalid data or input, and trying again would not help.
pub(crate) fn is_tls_failure(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput
    )
}

#[cfg(test)]
mod tests {
    use super::TlsSettings;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn defaults_leave_lapin_on_its_own_roots() {
        let settings = TlsSettings::default();
        assert!(!settings.is_configured());
        assert_eq!(settings.to_lapin().unwrap(), Default::default());
    }

    #[test]
    fn ca_certificates_are_joined_into_one_chain() {
        let mut settings = TlsSettings::default();
        settings.add_ca_certificate(CERT.to_string());
        settings.add_ca_certificate(CERT.to_string());
        let config = settings.to_lapin().unwrap();
        assert_eq!(
            config
                .cert_chain
                .unwrap()
                .matches("BEGIN CERTIFICATE")
                .count(),
            2
        );
    }

    #[test]
    fn a_ca_without_a_certificate_is_refused() {
        let mut settings = TlsSettings::default();
        settings.add_ca_certificate("/etc/ssl/ca.pem".to_string());
        let error = settings.to_lapin().unwrap_err().to_string();
        assert!(error.contains("TLS CA certificate"), "{error}");
    }

    #[test]
    fn debug_never_shows_the_private_key() {
        let mut settings = TlsSettings::default();
        settings.set_identity(
            CERT.to_string(),
            "-----BEGIN PRIVATE KEY-----\nsecret-key\n-----END PRIVATE KEY-----".to_string(),
        );
        let debug = format!("{settings:?}");
        assert!(!debug.contains("secret-key"), "{debug}");
        assert!(settings.to_lapin().unwrap().identity.is_some());
    }
}

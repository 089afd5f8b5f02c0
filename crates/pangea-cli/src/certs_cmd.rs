//! `pangea certs`: make, rotate, revoke and list the cluster's certificates.

use anyhow::Result;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub(crate) enum CertsCommand {
    /// Create the cluster CA in DIR (ca.pem, ca.key).
    Init {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Issue a replica, client, operator or loader certificate signed by the
    /// cluster CA.
    ///
    /// Exactly one of --replica, --client, --operator, --loader. Files:
    /// DIR/replicas/ID.pem, clients/NAME.pem, operators/NAME.pem, loaders/NAME.pem
    /// (and .key).
    Issue(IssueArgs),
    /// Re-issue a leaf certificate (same identity, new key, current issuing CA).
    ///
    /// Running replicas and clients pick it up on SIGHUP or within their poll
    /// interval (30 s by default), without restarting.
    Reissue {
        #[arg(long)]
        dir: PathBuf,
        /// The leaf's name: a replica id, or a client, operator or loader name.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        name: Option<String>,
        /// Every replica, client, operator and loader certificate in DIR (step 2 of
        /// a CA rotation).
        #[arg(long)]
        all: bool,
        /// Also revoke the certificate being replaced (a compromised key): both
        /// files change together, so processes load them on the same reload.
        #[arg(long, conflicts_with = "all")]
        revoke_old: bool,
        /// When leaves of several kinds share NAME, which one.
        #[arg(long, value_enum)]
        kind: Option<LeafKindArg>,
    },
    /// Revoke the certificate a leaf currently holds (DIR/crl.pem).
    ///
    /// Its serial goes into the CRL of its CA, signed by that CA. Replicas refuse it
    /// at the next handshake and close its connections within their poll interval
    /// (30 s by default), at once on SIGHUP.
    Revoke {
        #[arg(long)]
        dir: PathBuf,
        /// The leaf's name: a replica id, or a client, operator or loader name.
        name: String,
        /// When leaves of several kinds share NAME, which one.
        #[arg(long, value_enum)]
        kind: Option<LeafKindArg>,
    },
    /// Rotate the cluster CA through a dual-CA trust bundle: start, promote, finish.
    ///
    /// `start`: a new CA joins the bundle DIR/ca.pem. `promote`: it signs new leaves
    /// (then `reissue --all`). `finish`: the old CA leaves the bundle. Distribute the
    /// changed files and wait one reload interval between steps.
    RotateCa {
        #[arg(long)]
        dir: PathBuf,
        #[arg(value_enum)]
        step: RotateStep,
        /// `finish` even though some leaves in DIR still come from the old CA
        /// (they will be refused everywhere).
        #[arg(long)]
        force: bool,
    },
    /// List the trusted CAs and every leaf: serial, issuer, validity, revoked.
    List {
        #[arg(long)]
        dir: PathBuf,
    },
}

/// Flags of `certs issue`: the directory and exactly one identity.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("identity")
        .required(true)
        .args(["replica", "client", "operator", "loader"])
))]
#[command(group(clap::ArgGroup::new("has_app_profile").args(["client", "loader"])))]
pub(crate) struct IssueArgs {
    #[arg(long)]
    dir: PathBuf,
    /// A replica id (its region comes from --region or --topology):
    /// pangea://replica/ID?region=R.
    #[arg(long)]
    replica: Option<String>,
    /// The replica's region.
    // `requires` alone is met by any member of the "identity" group (clap), so the
    // other kinds are excluded explicitly.
    #[arg(long, requires = "replica", conflicts_with_all = ["client", "operator", "loader"])]
    region: Option<String>,
    /// Read the replica's region from this topology file.
    #[arg(long, requires = "replica", conflicts_with_all = ["client", "operator", "loader"])]
    topology: Option<PathBuf>,
    /// A client name (ad-serving frontends): pangea://client/NAME?app_profile=P,
    /// P from --app-profile (default `frontend`).
    #[arg(long)]
    client: Option<String>,
    /// An operator name (a person or an administration tool; no app profile):
    /// pangea://operator/NAME.
    #[arg(long)]
    operator: Option<String>,
    /// A loader name (a batch pipeline; needs --app-profile):
    /// pangea://loader/NAME?app_profile=P.
    #[arg(long, requires = "app_profile")]
    loader: Option<String>,
    /// The app profile the client or loader acts for.
    #[arg(long, requires = "has_app_profile")]
    app_profile: Option<String>,
}

/// `--kind` of `certs reissue` and `certs revoke`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum LeafKindArg {
    Replica,
    Client,
    Operator,
    Loader,
}

impl From<LeafKindArg> for pangea_net::rotation::LeafKind {
    fn from(k: LeafKindArg) -> Self {
        match k {
            LeafKindArg::Replica => Self::Replica,
            LeafKindArg::Client => Self::Client,
            LeafKindArg::Operator => Self::Operator,
            LeafKindArg::Loader => Self::Loader,
        }
    }
}

/// The steps of `certs rotate-ca`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum RotateStep {
    /// Create the next CA and add it to the trust bundle.
    Start,
    /// Make the next CA the issuing CA (keep the old key to revoke its leaves).
    Promote,
    /// Remove the old CA from the trust bundle, its CRL and its key.
    Finish,
}

pub(crate) fn certs(cmd: CertsCommand) -> Result<()> {
    match cmd {
        CertsCommand::Init { dir } => {
            pangea_net::certs::init_ca(&dir)?;
            println!("created cluster CA in {}", dir.display());
        }
        CertsCommand::Issue(args) => issue(args)?,
        CertsCommand::Reissue {
            dir,
            name,
            all,
            revoke_old,
            kind,
        } => {
            use pangea_net::rotation;
            let done = match (name, all) {
                (_, true) => {
                    let all = rotation::reissue_all(&dir)?;
                    for (kind, name) in &all.skipped_revoked {
                        println!(
                            "skipped {} {name}: its certificate is revoked (re-issue it by name \
                             to re-admit it)",
                            kind.as_str()
                        );
                    }
                    all.reissued
                }
                (Some(name), false) => vec![rotation::reissue(
                    &dir,
                    &name,
                    kind.map(Into::into),
                    revoke_old,
                )?],
                (None, false) => anyhow::bail!("say NAME or --all"),
            };
            for r in &done {
                println!(
                    "re-issued {} {}: serial {} -> {} (issuer {:?}){}",
                    r.kind.as_str(),
                    r.name,
                    r.old.serial,
                    r.new.serial,
                    r.new.issuer,
                    if r.old_revoked {
                        format!("; revoked {}", r.old.serial)
                    } else {
                        String::new()
                    }
                );
            }
            println!(
                "{} certificate(s) re-issued in {}; copy them to their hosts, then SIGHUP \
                 the processes or wait one reload interval (30 s by default)",
                done.len(),
                dir.display()
            );
        }
        CertsCommand::Revoke { dir, name, kind } => {
            let r = pangea_net::rotation::revoke(&dir, &name, kind.map(Into::into))?;
            if r.newly {
                println!(
                    "revoked {name} (serial {}, issuer {:?}); {} now lists {} certificate(s)",
                    r.cert.serial,
                    r.cert.issuer,
                    r.crl.display(),
                    r.entries
                );
                println!(
                    "copy {} to every replica and client host; they refuse it at once on \
                     SIGHUP, or within one reload interval (30 s by default), and close its \
                     connections then",
                    r.crl.display()
                );
            } else {
                println!(
                    "{name} (serial {}) was already revoked in {}",
                    r.cert.serial,
                    r.crl.display()
                );
            }
        }
        CertsCommand::RotateCa { dir, step, force } => {
            use pangea_net::rotation;
            match step {
                RotateStep::Start => {
                    let ca = rotation::rotate_ca_start(&dir)?;
                    println!(
                        "added CA {:?} (serial {}) to {}",
                        ca.subject,
                        ca.serial,
                        pangea_net::certs::ca_cert_path(&dir).display()
                    );
                    println!(
                        "next: copy ca.pem to every replica and client host, wait one reload \
                         interval (or SIGHUP), then `pangea certs rotate-ca --dir {} promote`",
                        dir.display()
                    );
                }
                RotateStep::Promote => {
                    let ca = rotation::rotate_ca_promote(&dir)?;
                    println!(
                        "CA {:?} (serial {}) now signs new leaves",
                        ca.subject, ca.serial
                    );
                    println!(
                        "next: `pangea certs reissue --dir {0} --all`, copy the leaves to their \
                         hosts, wait one reload interval, then `pangea certs rotate-ca --dir {0} \
                         finish`",
                        dir.display()
                    );
                }
                RotateStep::Finish => {
                    let ca = rotation::rotate_ca_finish(&dir, force)?;
                    println!(
                        "removed CA {:?} (serial {}) from the trust bundle",
                        ca.subject, ca.serial
                    );
                    println!(
                        "next: copy ca.pem (and crl.pem, if present) to every host; after one \
                         reload interval, leaves of the old CA are refused and their \
                         connections closed"
                    );
                }
            }
        }
        CertsCommand::List { dir } => {
            let (cas, leaves) = pangea_net::rotation::status(&dir)?;
            for ca in &cas {
                println!(
                    "ca       {:<8} {:<28} serial {} valid {} .. {}",
                    ca.role,
                    ca.info.subject,
                    ca.info.serial,
                    pangea_net::rotation::utc_date(ca.info.not_before_unix),
                    pangea_net::rotation::utc_date(ca.info.not_after_unix)
                );
            }
            for l in &leaves {
                let state = match (l.revoked, l.trusted) {
                    (true, _) => "REVOKED",
                    (false, false) => "UNTRUSTED",
                    (false, true) => "ok",
                };
                println!(
                    "{:<8} {:<9} {:<28} serial {} issuer {:?} valid {} .. {}",
                    l.kind.as_str(),
                    state,
                    l.name,
                    l.info.serial,
                    l.info.issuer,
                    pangea_net::rotation::utc_date(l.info.not_before_unix),
                    pangea_net::rotation::utc_date(l.info.not_after_unix)
                );
            }
        }
    }
    Ok(())
}

/// `certs issue`: one leaf of the kind given.
fn issue(args: IssueArgs) -> Result<()> {
    let IssueArgs {
        dir,
        replica,
        region,
        topology,
        client,
        operator,
        loader,
        app_profile,
    } = args;
    // clap's "identity" group makes exactly one of the four present.
    match (replica, client, operator, loader) {
        (Some(id), None, None, None) => {
            let region = match (region, topology) {
                (Some(r), _) => r,
                (None, Some(t)) => {
                    let t =
                        pangea_topology::Topology::load(&t).map_err(|p| anyhow::anyhow!("{p}"))?;
                    t.region_of(&id)
                        .map(|r| r.to_string())
                        .ok_or_else(|| anyhow::anyhow!("replica {id:?} is not in the topology"))?
                }
                (None, None) => anyhow::bail!("--replica needs --region or --topology"),
            };
            pangea_net::certs::issue_replica(&dir, &id, &region)?;
            println!(
                "issued replica certificate {id} ({region}) in {}",
                dir.display()
            );
        }
        (None, Some(name), None, None) => {
            let profile = app_profile.unwrap_or_else(|| "frontend".into());
            pangea_net::certs::issue_client(&dir, &name, &profile)?;
            println!(
                "issued client certificate {name} (app profile {profile}) in {}",
                dir.display()
            );
        }
        (None, None, Some(name), None) => {
            pangea_net::certs::issue_operator(&dir, &name)?;
            println!("issued operator certificate {name} in {}", dir.display());
        }
        (None, None, None, Some(name)) => {
            let profile =
                app_profile.ok_or_else(|| anyhow::anyhow!("--loader needs --app-profile"))?;
            pangea_net::certs::issue_loader(&dir, &name, &profile)?;
            println!(
                "issued loader certificate {name} (app profile {profile}) in {}",
                dir.display()
            );
        }
        _ => anyhow::bail!(
            "say exactly one of --replica ID, --client NAME, --operator NAME, --loader NAME"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::CertsCommand;
    use clap::Parser as _;

    /// `pangea certs ...` alone, to check its flags.
    #[derive(Debug, clap::Parser)]
    struct Certs {
        #[command(subcommand)]
        command: CertsCommand,
    }

    fn parse(args: &[&str]) -> Result<CertsCommand, clap::Error> {
        let argv = ["certs"].iter().chain(args).copied();
        Certs::try_parse_from(argv).map(|c| c.command)
    }

    #[test]
    fn issue_takes_exactly_one_identity() {
        for ok in [
            &["issue", "--dir", "d", "--replica", "r1", "--region", "eu"][..],
            &["issue", "--dir", "d", "--client", "fe"],
            &[
                "issue",
                "--dir",
                "d",
                "--client",
                "fe",
                "--app-profile",
                "p",
            ],
            &["issue", "--dir", "d", "--operator", "alice"],
            &[
                "issue",
                "--dir",
                "d",
                "--loader",
                "etl",
                "--app-profile",
                "p",
            ],
        ] {
            assert!(parse(ok).is_ok(), "{ok:?}: {:?}", parse(ok).err());
        }
        for (bad, kind) in [
            (
                &["issue", "--dir", "d"][..],
                clap::error::ErrorKind::MissingRequiredArgument,
            ),
            (
                &["issue", "--dir", "d", "--operator", "a", "--client", "b"],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                &[
                    "issue",
                    "--dir",
                    "d",
                    "--replica",
                    "r",
                    "--loader",
                    "l",
                    "--app-profile",
                    "p",
                ],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                &["issue", "--dir", "d", "--loader", "etl"],
                clap::error::ErrorKind::MissingRequiredArgument,
            ),
            (
                &[
                    "issue",
                    "--dir",
                    "d",
                    "--operator",
                    "a",
                    "--app-profile",
                    "p",
                ],
                clap::error::ErrorKind::MissingRequiredArgument,
            ),
            (
                &["issue", "--dir", "d", "--operator", "a", "--region", "eu"],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                &[
                    "issue",
                    "--dir",
                    "d",
                    "--client",
                    "c",
                    "--topology",
                    "t.toml",
                ],
                clap::error::ErrorKind::ArgumentConflict,
            ),
            (
                &[
                    "issue",
                    "--dir",
                    "d",
                    "--replica",
                    "r",
                    "--app-profile",
                    "p",
                ],
                clap::error::ErrorKind::MissingRequiredArgument,
            ),
        ] {
            match parse(bad) {
                Err(e) => assert_eq!(e.kind(), kind, "{bad:?}: {e}"),
                Ok(c) => panic!("{bad:?} parsed as {c:?}"),
            }
        }
    }

    #[test]
    fn reissue_and_revoke_take_every_kind() {
        for kind in ["replica", "client", "operator", "loader"] {
            assert!(parse(&["revoke", "--dir", "d", "x", "--kind", kind]).is_ok());
            assert!(parse(&["reissue", "--dir", "d", "x", "--kind", kind]).is_ok());
        }
        assert!(parse(&["revoke", "--dir", "d", "x", "--kind", "admin"]).is_err());
    }
}

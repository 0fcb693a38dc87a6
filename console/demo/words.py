"""What the demo's agents and admins write, in the demo's language (`SAFESTOP_DEMO_LANGUAGE`,
`en` or `zh-hans`): run titles, step names, approval summaries, tool results and artifacts, a
shell's output, a steering message, the bots' notes; and what `demo_setup` names (teams, rules,
policy descriptions, the mail channel).

These are the agents' and admins' own words, stored as they store them (the API, the ledger and
the exports hold what was written), so they are chosen when the demo seeds them, not translated
by the console when it shows them: a Chinese team's agents write Chinese titles, and the console
never rewrites what an agent said. Like the scenarios, this imports nothing from Django.

Each key is an English `str.format` template; `tests/demo` checks that every template the demo
uses has its Simplified Chinese one here, with the same fields, and that a zh-hans demo stores
no English prose.
"""

from __future__ import annotations

from typing import Any

LANGUAGES = ("en", "zh-hans")

ZH_HANS: dict[str, str] = {
    # run titles
    "Answer support ticket #{ticket}": "回复客服工单 #{ticket}",
    "Send invoice reminders (batch {batch})": "发送发票催缴提醒（批次 {batch}）",
    "Revenue report {quarter}": "{quarter} 营收报告",
    "Deploy billing-api {version}": "部署 billing-api {version}",
    "Export ledger batch {export}": "导出账务批次 {export}",
    "Crawl the partner catalog": "抓取合作伙伴商品目录",
    "Summarise the quarter's supplier contracts": "汇总本季度的供应商合同",
    "Research {topic}": "调研：{topic}",
    "Sync ledger batch {batch}": "同步账务批次 {batch}",
    "Summarise incident INC-{incident}": "撰写事故 INC-{incident} 的总结",
    "Watch the on-call queue": "盯守值班队列",
    "Refund order #{order}": "为订单 #{order} 退款",
    "Release {service} {version} to production": "将 {service} {version} 发布到生产环境",
    "Email {address} about invoice {invoice}": "就发票 {invoice} 给 {address} 发邮件",
    # step names
    "Plan the answer": "规划回复",
    "Search the knowledge base": "检索知识库",
    "Read the best article": "阅读最相关的文章",
    "Draft the reply": "起草回复",
    "Post the reply to the helpdesk": "把回复发到客服系统",
    "Select overdue customers": "筛选逾期客户",
    "Send reminders": "发送提醒",
    "Plan the report": "规划报告",
    "Query the warehouse": "查询数据仓库",
    "Publish the report": "发布报告",
    "Build the release": "构建发布版本",
    "Apply database migrations": "执行数据库迁移",
    "Announce the deploy": "通告部署",
    "Export rows to the finance system": "把数据导出到财务系统",
    "Crawl pages": "抓取页面",
    "Summarise each contract": "逐份汇总合同",
    "Search until satisfied": "持续检索直到满意",
    "Sync the batch": "同步该批次",
    "Gather the timeline": "整理时间线",
    "Write the summary": "撰写总结",
    "Watch the queue": "盯守队列",
    "Poll the queue ({polls})": "轮询队列（第 {polls} 次）",
    "Page the on-call engineer": "呼叫值班工程师",
    "Check the order": "核对订单",
    "Refund the customer": "给客户退款",
    "Tell the customer": "通知客户",
    "Run the release checks": "运行发布检查",
    "Deploy to production": "部署到生产环境",
    "Watch the canary": "观察金丝雀发布",
    "Draft the email": "起草邮件",
    "Send the email": "发送邮件",
    # what a reviewer reads on an approval, a steering message, an e-mail the agent writes
    "Refund €{amount} to {customer} for returned order #{order}": (
        "为退货订单 #{order} 向 {customer} 退款 €{amount}"
    ),
    "Roll {service} {version} out to production (10% canary first)": (
        "将 {service} {version} 发布到生产环境（先 10% 金丝雀）"
    ),
    "Remind {address} that invoice {invoice} is overdue": "提醒 {address}：发票 {invoice} 已逾期",
    "Your invoice {invoice} is overdue": "您的发票 {invoice} 已逾期",
    "Hello,\n\ninvoice {invoice} is 14 days late.": "您好：\n\n发票 {invoice} 已逾期 14 天。",
    "Focus on customer impact in the EU region first.": "先关注欧盟地区的客户影响。",
    # what the tools answer, the artifacts the agents keep, what a shell prints
    "ticket {ticket} refund status": "工单 {ticket} 的退款状态",
    "search results": "检索结果",
    "How refunds are processed (1,240 words)": "退款处理流程（1,240 字）",
    "draft reply": "回复草稿",
    "Hello, about ticket #{ticket}: ...": "您好，关于工单 #{ticket}：……",
    "scanned {done}/{chunks} partitions": "已扫描 {done}/{chunks} 个分区",
    "building {version}": "正在构建 {version}",
    "built": "构建完成",
    "applying 0042_invoices": "正在执行迁移 0042_invoices",
    "migration applied": "迁移已完成",
    "billing-api {version} deployed": "billing-api {version} 已部署",
    "page {page}: 40 products": "第 {page} 页：40 件商品",
    "summary of contract {contract}": "合同 {contract} 的摘要",
    "refund policy": "退款政策",
    "shipping times": "配送时效",
    "warranty terms": "保修条款",
    "no new results": "没有新结果",
    "ledger API timed out (attempt {attempt})": "账务 API 超时（第 {attempt} 次尝试）",
    "42 log lines": "42 行日志",
    "incident summary": "事故总结",
    "INC-{incident}: EU customers first ...": "INC-{incident}：优先处理欧盟客户……",
    "rolling out {service} {version} to {percent}%": "正在将 {service} {version} 发布到 {percent}%",
    "rolled out": "发布完成",
    # how an approval ended, as the agent records it and tells its model
    "refunded {cents} cents": "已退款 {cents} 分",
    "deployed at {percent}%": "已按 {percent}% 部署",
    "email approved": "邮件已批准",
    "email queued": "邮件已排队",
    "refund": "退款",
    "deploy": "部署",
    "email": "邮件",
    "{what} {status}": "{what}{status}",
    "rejected": "被拒绝",
    "expired": "已过期",
    "void": "已作废",
    "{what}: approval {status}": "{what}：审批{status}",
    "Told the model: the reviewer said no ({status}): {message}": (
        "已告知模型：审核员没有批准（{status}）：{message}"
    ),
    "no message": "没有留言",
    # the reviewer and approver bots' notes, the simulator's own stop note
    "reviewer bot: not needed any more": "审核机器人：已不再需要",
    "reviewer bot: a human will finish this": "审核机器人：由人来完成",
    "simulator shutting down": "模拟器正在关闭",
    "approver bot: not today, ask the account owner first": "审批机器人：今天不行，先问问账户负责人",
    "approver bot: fine": "审批机器人：可以",
    "approver bot: approved with a smaller change": "审批机器人：已批准，但改小了一些",
    "approver bot: looks right": "审批机器人：看起来没问题",
    "[reviewed] {subject}": "[已审核] {subject}",
    # what `demo_setup` names: the teams, approval rules, policies and mail channel
    "Payments": "支付",
    "Platform": "平台",
    "Payments need a reviewer": "付款须经审核员审批",
    "Customer email": "客户邮件",
    "Production deploys": "生产环境部署",
    "The same call five times in a row is a loop: stop it.": "同一调用连续五次即是死循环：停止它。",
    "Three failed tool results in a row: stop before it makes it worse.": (
        "工具调用连续失败三次：在情况变糟之前停止。"
    ),
    "Observe only: which runs would a 20-second limit have stopped?": (
        "仅观察：若限时 20 秒，哪些运行本会被停止？"
    ),
    "Demo mailbox": "演示邮箱",
}


def words(language: str, template: str, **values: Any) -> str:
    """`template` in `language` (English when it has no translation), filled with `values`."""
    chosen = ZH_HANS.get(template, template) if language == "zh-hans" else template
    return chosen.format(**values) if values else chosen


def spellings(text: str) -> tuple[str, ...]:
    """`text` (a name without fields) in every demo language: what `demo_setup` looks for, so
    a demo seeded in one language and set up again in another makes no second rule."""
    return tuple(dict.fromkeys(words(language, text) for language in LANGUAGES))
